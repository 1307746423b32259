"""GradientStore: gradients in, CIDs out, and every fetched block verified before use.

put streams the canonical document through the chunker and DAG builder in one
pass (``_put``): leaves go to the node while they are hashed, the dag-pb nodes
follow, and the node must store exactly the locally computed root, pinned.  get verifies every block against its CID
while writing leaf data into one preallocated buffer (Kubo: nodes by block/get,
leaves by cat hashed in place, on a node that ``SupportsCatInto``; other nodes: a CAR
export), and only then decodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..dag import (
    CID,
    EMPTY_FILE,
    Block,
    CarReader,
    FileAssembler,
    build_file,
)
from ..dag.assemble import LeafSpan
from ..dag.cid import RAW
from ..errors import DAGError, IntegrityError, InvalidDocumentError
from ..format import (
    DEFAULT_LIMITS,
    CompressedGradient,
    EncodedDocument,
    Gradient,
    Limits,
    decode_any,
    encode,
)
from ..node import Node, SupportsCatInto
from ._put import PROGRESS_BYTES, Progress, put_document

_CAR_BATCH_BYTES = 8 << 20  # blocks of a CAR export are verified in a thread this many at a time
_MAX_NODE_FETCHES = 64  # dag-pb nodes fetched at once by block/get (64 GiB files under the profile)


@dataclass(frozen=True)
class VerifyReport:
    """What ``GradientStore.verify`` checked about one CID."""

    cid: CID
    size: int
    blocks: int
    tensors: int
    seconds: float


class GradientStore:
    """Put, get and verify gradstore/1 documents over a ``Node``."""

    def __init__(self, node: Node, *, limits: Limits = DEFAULT_LIMITS) -> None:
        self.node = node
        self.limits = limits

    # -- put ---------------------------------------------------------------
    async def put(
        self,
        gradient: Gradient | CompressedGradient,
        *,
        pin: bool = True,
        progress: Progress | None = None,
    ) -> CID:
        """Store ``gradient`` (dense, or compressed: gradstore/2) on the node, pinned by
        default, and return its CID."""
        return await self.put_document(encode(gradient), pin=pin, progress=progress)

    async def put_document(
        self, doc: EncodedDocument, *, pin: bool = True, progress: Progress | None = None
    ) -> CID:
        """Store an encoded document; the root is computed locally and must match the node's.

        One pass: the leaves are streamed to the node while a worker thread hashes
        them, then the dag-pb nodes and the root (see ``_put``). Do not modify the
        arrays until ``put`` returns.
        """
        return await put_document(self.node, doc, pin=pin, progress=progress)

    # -- get ---------------------------------------------------------------
    async def fetch_document(
        self, cid: CID | str, *, max_bytes: int | None = None, progress: Progress | None = None
    ) -> np.ndarray:
        """Fetch the file bytes of ``cid``, every block verified, into one buffer.

        On a node with fast ``cat_into`` (Kubo over plain http), the dag-pb
        nodes come from ``block/get`` and the leaves' bytes from ``cat`` straight
        into the buffer, each leaf hashed there against its CID (Kubo's ``dag/export``
        is several times slower than ``cat``); otherwise from a CAR stream.
        """
        root = CID.parse(cid)
        limit = self.limits.max_bytes if max_bytes is None else max_bytes
        assembler = FileAssembler(root, limit)
        node = self.node
        if isinstance(node, SupportsCatInto) and node.bulk_reads:
            spans = await _fetch_inner_nodes(node, assembler)
            if assembler.done:
                return assembler.result()
            if spans is not None:
                return await _cat_leaves(node, assembler, spans, progress)
        return await self._fetch_car(root, assembler, progress)

    async def _fetch_car(
        self, root: CID, assembler: FileAssembler, progress: Progress | None
    ) -> np.ndarray:
        """``fetch_document`` from the node's CAR export, every block verified as it arrives."""
        reader = CarReader()
        pending: list[Block] = []
        pending_bytes = received = reported = 0
        async for chunk in self.node.export_car(root):
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
        if (
            reader.roots is not None
            and root not in reader.roots
            and root.to_v1() not in reader.roots
        ):
            raise IntegrityError(root, f"node exported roots {reader.roots}, expected {root}")
        result = assembler.result()
        if progress is not None:
            progress(int(result.size), int(result.size))
        return result

    async def get(
        self, cid: CID | str, *, limits: Limits | None = None, progress: Progress | None = None
    ) -> Gradient:
        """Fetch, verify and decode the gradient at ``cid`` (zero-copy views into one buffer).

        A compressed document (gradstore/2) is refused with InvalidDocumentError: use
        :meth:`get_any`.
        """
        got = await self.get_any(cid, limits=limits, progress=progress)
        if isinstance(got, CompressedGradient):
            raise InvalidDocumentError(
                f"a compressed document (gradstore/2, codec {got.codec}): fetch it with "
                "get_any(), which returns a CompressedGradient",
                "$.format",
            )
        return got

    async def get_any(
        self, cid: CID | str, *, limits: Limits | None = None, progress: Progress | None = None
    ) -> Gradient | CompressedGradient:
        """:meth:`get` for either format, as ``decode_any``: a ``Gradient``, or a
        ``CompressedGradient`` whose payloads are views into the fetched buffer, nothing
        decompressed until asked (``decompress(max_bytes=...)`` gives the float64 values).
        """
        lim = limits or self.limits
        buf = await self.fetch_document(cid, max_bytes=lim.max_bytes, progress=progress)
        return decode_any(buf, lim)

    async def verify(self, cid: CID | str, *, progress: Progress | None = None) -> VerifyReport:
        """Fetch every block, check its hash, decode strictly and recompute the root CID."""
        start = time.perf_counter()
        root = CID.parse(cid)
        buf = await self.fetch_document(root, progress=progress)
        gradient = decode_any(buf, self.limits)
        again, blocks = await asyncio.to_thread(_root_and_count, encode(gradient))
        if again != root.to_v1():
            raise IntegrityError(
                root, f"re-encoding {root} gives {again}: not a canonical document"
            )
        return VerifyReport(
            root, int(buf.size), blocks, len(gradient.tensors), time.perf_counter() - start
        )

    async def unpin(self, cid: CID | str) -> None:
        """Drop the recursive pin of ``cid`` (its blocks may then be garbage collected)."""
        await self.node.unpin(CID.parse(cid))


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
    progress: Progress | None,
) -> np.ndarray:
    """Fill the leaves from ``cat`` into the assembler's buffer, hashing each span as it lands."""
    buf = assembler.buffer
    assert buf is not None
    size = len(buf)
    loop = asyncio.get_running_loop()
    filled = _Filled()

    def verify() -> None:
        reported = 0
        for span in spans:
            if not filled.wait_for(span.offset + span.size):
                return
            assembler.verify_in_place(span)
            done = span.offset + span.size
            if progress is not None and done - reported >= PROGRESS_BYTES:
                loop.call_soon_threadsafe(progress, done, size)
                reported = done

    async def read() -> int:
        try:
            return await node.cat_into(assembler.root, buf.data, progress=filled.advance)
        finally:
            filled.end()

    reader = asyncio.ensure_future(read())
    try:
        await asyncio.to_thread(verify)
    except BaseException:
        filled.abort()
        reader.cancel()  # closes the transfer's socket; its thread ends at once
        with contextlib.suppress(BaseException):
            await reader
        raise
    got = await reader
    if got != size:
        raise DAGError(f"file {assembler.root} is incomplete: the node sent {got} of {size} bytes")
    result = assembler.result()
    if progress is not None:
        progress(size, size)
    return result


def _root_and_count(doc: EncodedDocument) -> tuple[CID, int]:
    """The root CID of ``doc``'s DAG and how many blocks (places) it has."""
    count = 0
    root = EMPTY_FILE.cid
    for block in build_file(doc, threads=2):
        count += 1
        root = block.cid
    return root, count


def _add_all(assembler: FileAssembler, blocks: list[Block]) -> None:
    for block in blocks:
        assembler.add(block)
