"""get's transfer: a document's blocks into one buffer, every block verified before use.

On Kubo (a node that ``SupportsCatInto``) the dag-pb nodes come from ``block/get`` and the
leaves' bytes from ``cat`` straight into the buffer, each leaf hashed there against its
CID by a second thread (one of its own: it waits on the read, which runs in the event
loop's pool); on other nodes, from a CAR export verified as it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Protocol

from ..dag import CID, Block, CarReader, FileAssembler
from ..dag.assemble import LeafSpan, anonymous_buffer
from ..dag.cid import RAW
from ..errors import DAGError, IntegrityError
from ..node import Node, SupportsCatInto
from ._leaf_check import LeafCheck
from ._put import PROGRESS_BYTES, ByteProgress

_CAR_BATCH_BYTES = 8 << 20  # blocks of a CAR export are verified in a thread this many at a time


class Sink(Protocol):
    """Where a fetch puts a document besides its buffer (a spill file: ``SpillWriter``)."""

    def allocate(self, size: int) -> memoryview:
        """The buffer of a document of the ``size`` its root declares."""
        ...

    def verified(self, prefix: int) -> None:
        """The buffer's first ``prefix`` bytes are hashed (called in the hashing thread)."""
        ...


_MAX_NODE_FETCHES = 64  # dag-pb nodes fetched at once by block/get (64 GiB files under the profile)
#: Documents up to this size are hashed by the thread that reads them, leaf by leaf as each
#: is in, not beside it by a thread of their own (started, and woken per leaf, per document).
HASH_IN_READER_BYTES = 4 << 20


async def fetch_view(
    node: Node,
    cid: CID | str,
    max_bytes: int,
    progress: ByteProgress | None,
    *,
    root: bytes | None = None,
    sink: Sink | None = None,
) -> memoryview:
    """Fetch the file bytes of ``cid``, every block verified, into one buffer.

    On a node with fast ``cat_into`` (Kubo over plain http), the dag-pb
    nodes come from ``block/get`` and the leaves' bytes from ``cat`` straight
    into the buffer, each leaf hashed there against its CID (Kubo's ``dag/export``
    is several times slower than ``cat``); otherwise from a CAR stream. ``root``: the
    root block's bytes when the caller fetched them already (a coordinator checks the
    size a root declares first): verified against ``cid`` and not fetched again.
    ``sink``: gives the buffer once the root declares its size, and hears of each prefix
    hashed (a coordinator's spill file, written as the bytes are verified).
    """
    allocate = anonymous_buffer if sink is None else sink.allocate
    assembler = FileAssembler(CID.parse(cid), max_bytes, allocate=allocate)
    root_cid = assembler.root
    if root is not None:
        await asyncio.to_thread(assembler.add, Block(root_cid, root))
    if isinstance(node, SupportsCatInto) and node.bulk_reads:
        spans = await _fetch_inner_nodes(node, assembler)
        if assembler.done:
            return assembler.view()
        if spans is not None:
            return await _cat_leaves(node, assembler, spans, progress, sink)
    return await _fetch_car(node, root_cid, assembler, progress)


async def _fetch_car(
    node: Node, root: CID, assembler: FileAssembler, progress: ByteProgress | None
) -> memoryview:
    """``fetch_document`` from the node's CAR export, every block verified as it arrives."""
    reader = CarReader()
    pending: list[Block] = []
    pending_bytes = received = reported = 0
    async for chunk in node.export_car(root):
        received += len(chunk)
        for block in reader.feed(chunk):
            pending.append(block)
            pending_bytes += len(block.data)
        if pending_bytes >= _CAR_BATCH_BYTES:
            await asyncio.to_thread(_add_all, assembler, pending)
            pending, pending_bytes = [], 0
        if progress is not None and received - reported >= PROGRESS_BYTES:
            progress(received, 0)
            reported = received
    reader.close()
    if pending:
        await asyncio.to_thread(_add_all, assembler, pending)
    if reader.roots is not None and root not in reader.roots and root.to_v1() not in reader.roots:
        raise IntegrityError(root, f"node exported roots {reader.roots}, expected {root}")
    result = assembler.view()
    if progress is not None:
        progress(result.nbytes, result.nbytes)
    return result


async def _fetch_inner_nodes(node: Node, assembler: FileAssembler) -> list[LeafSpan] | None:
    """Fetch the root and every dag-pb node below it (``block/get``, one level at a time).

    Returns the leaf spans to fill by ``cat`` (see ``FileAssembler.leaf_spans``),
    or None when the file cannot be filled that way (the assembler may then
    still take blocks from a CAR).
    """
    while not assembler.done:
        spans = assembler.leaf_spans()
        if spans is not None:
            return spans
        nodes = [c for c in assembler.wanted() if c.codec != RAW or c == assembler.root]
        if not nodes or len(nodes) > _MAX_NODE_FETCHES:
            return None  # dag-pb leaves (old CIDv0 files) or a huge file: the CAR path
        blocks = await asyncio.gather(*(node.get_block(c) for c in nodes))
        for c, data in zip(nodes, blocks, strict=True):
            await asyncio.to_thread(assembler.add, Block(c, data))
    return None


class _Filled:
    """The length of the buffer's filled prefix, shared by the reading and the hashing thread.

    The reader advances once per socket read (a few KiB); the hasher is woken only when
    the leaf it waits for is complete, not at every read (a wake-up is a thread switch).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pos = 0
        self._want = 0  # what the hasher waits for (0: nothing yet)
        self._ended = False
        self._aborted = False

    def advance(self, pos: int) -> None:
        """Reader: ``pos`` bytes are in (raises to stop the reader once hashing has failed)."""
        with self._cond:
            if self._aborted:
                raise _Aborted
            self._pos = pos
            if pos >= self._want:
                self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def abort(self) -> None:
        with self._cond:
            self._aborted = True
            self._cond.notify_all()

    def wait_for(self, pos: int) -> bool:
        """Hasher: wait until ``pos`` bytes are in; False if the reader ended or was stopped first."""
        with self._cond:
            self._want = pos
            self._cond.wait_for(lambda: self._pos >= pos or self._ended or self._aborted)
            return self._pos >= pos and not self._aborted


class _Aborted(Exception):
    """Stops a ``cat`` whose bytes already failed verification."""


async def _cat_leaves(
    node: SupportsCatInto,
    assembler: FileAssembler,
    spans: list[LeafSpan],
    progress: ByteProgress | None,
    sink: Sink | None = None,
) -> memoryview:
    """Fill the leaves from ``cat`` into the assembler's buffer, hashing each span as it lands
    (a ``sink`` hears of each span hashed, in the hashing thread; a small document's only at
    its end, from its owner)."""
    buf = assembler.buffer
    assert buf is not None
    size = len(buf)
    if size <= HASH_IN_READER_BYTES:
        check = LeafCheck(spans, assembler.verify_in_place)
        got = await node.cat_into(assembler.root, buf, progress=check)
        if got != size:
            raise DAGError(
                f"file {assembler.root} is incomplete: the node sent {got} of {size} bytes"
            )
        check(got)  # what the last progress call left, if any
        result = assembler.view()  # DAGError if a span went unhashed
        if progress is not None:
            progress(size, size)
        return result
    loop = asyncio.get_running_loop()
    filled = _Filled()

    def verify() -> None:
        reported = 0
        for span in spans:
            if not filled.wait_for(span.offset + span.size):
                return
            assembler.verify_in_place(span)
            done = span.offset + span.size
            if sink is not None:
                sink.verified(done)
            if progress is not None and done - reported >= PROGRESS_BYTES:
                loop.call_soon_threadsafe(progress, done, size)
                reported = done

    async def read() -> int:
        try:
            return await node.cat_into(assembler.root, buf, progress=filled.advance)
        finally:
            filled.end()

    reader = asyncio.ensure_future(read())
    try:
        await _own_thread(verify)
    except BaseException:
        filled.abort()
        reader.cancel()  # closes the transfer's socket; its thread ends at once
        with contextlib.suppress(BaseException):
            await reader
        raise
    got = await reader
    if got != size:
        raise DAGError(f"file {assembler.root} is incomplete: the node sent {got} of {size} bytes")
    result = assembler.view()
    if progress is not None:
        progress(size, size)
    return result


async def _own_thread(wait: Callable[[], None]) -> None:
    """Run ``wait`` in a thread of its own, not in the loop's default pool: the hasher waits
    on the read, which runs in that pool, so a pool full of waiting hashers (a few fetches
    at once: the pool has cores + 4 threads) would never read, and every fetch would hang
    until its timeout."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():  # cancelled meanwhile
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    job = [wait]  # dropped before the awaiting task is woken: see run

    def run() -> None:
        error: BaseException | None = None
        try:
            job.pop()()
        except BaseException as exc:  # handed to the awaiting task
            error = exc
        # ``wait`` (and what it holds: the document's buffer, maybe a spill file's mapping
        # its caller unmaps at once) is gone by now, not only when this thread ends
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits it
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="gradstore-leaf-hasher", daemon=True).start()
    await done


def _add_all(assembler: FileAssembler, blocks: list[Block]) -> None:
    for block in blocks:
        assembler.add(block)
