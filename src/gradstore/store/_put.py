"""put: a document's blocks to a node in one pass, hashed as they go, the root checked and pinned.

A worker thread chunks and hashes (two threads, zero-copy views of the
document) while the event loop streams the leaves to the node as they come,
over ``_PUT_STREAMS`` concurrent imports (Kubo then writes on every core). The
few dag-pb nodes follow once the last leaf is hashed: only then is the root
known. On a node that ``SupportsGuardedImport`` (Kubo) the imports hold its GC lock
and the root is pinned without the node's DAG walk; elsewhere they are CAR
imports and the node pins the root named by the last CAR. A small document (at most
``SMALL_PUT_BYTES``, or ``ONE_REQUEST_BYTES`` when no progress is asked for: a step's
document or aggregate) goes as one complete CAR whose root the import pins: one request,
where the streams, the dag-pb nodes and the guarded pin took five (Kubo's walk over a few
MiB is negligible, and the import holds its GC lock). A block
that names the small document's root (a step's record names its aggregate) may go in the
same CAR, not pinned by it (``put_small_with``): a ``block/put`` less, whose write Kubo
syncs to disk on its own (about 20 ms a call here, one at a time).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from typing import Final, TypeAlias

from ..dag import CID, EMPTY_FILE, Block, build_file, write_car
from ..dag.car import write_car_async
from ..dag.cid import RAW
from ..errors import NodeError
from ..format import EncodedDocument
from ..node import Node, SupportsGuardedImport

log = logging.getLogger("gradstore.store")

ByteProgress: TypeAlias = Callable[[int, int], None]
"""Called with (bytes done, bytes total) as a transfer advances."""

#: The earlier public name of ``ByteProgress`` (``gradstore.store.Progress``).
Progress: TypeAlias = ByteProgress

PROGRESS_BYTES = (
    1 << 20
)  # progress is reported about this often (a command's --timeout counts from it)
_QUEUE_BLOCKS = 16  # leaves hashed ahead of the upload (16 MiB)
_PUT_HASH_THREADS = 2  # sha256 threads while the node ingests
_PUT_STREAMS = 2  # concurrent leaf imports
#: A document at most this large is hashed first and sent as one CAR (``_put_small``).
SMALL_PUT_BYTES: Final = 2 << 20
#: The same when no progress is asked for (a coordinator's and a peer's own puts: a step of
#: 12.8 MB is one request, not five, and about half the CPU: 8 such puts took 0.12 s instead
#: of 0.24 s, Kubo the same); with progress (a command's --timeout counts from it) a
#: document over ``SMALL_PUT_BYTES`` streams, reporting as it goes.
ONE_REQUEST_BYTES: Final = 16 << 20


async def put_document(
    node: Node, doc: EncodedDocument, *, pin: bool, progress: ByteProgress | None
) -> CID:
    """Store ``doc``'s DAG on ``node`` and return its root, which the node must agree on."""
    if doc.size <= (SMALL_PUT_BYTES if progress is not None else ONE_REQUEST_BYTES):
        return await _put_small(node, doc, pin=pin, progress=progress)
    loop = asyncio.get_running_loop()
    leaves: asyncio.Queue[Block | BaseException | None] = asyncio.Queue(maxsize=_QUEUE_BLOCKS)
    inner: list[Block] = []
    first_leaf: list[Block] = []
    stop = threading.Event()
    sent = [0, 0]  # bytes sent, bytes at the last progress report

    def produce() -> None:
        try:
            for block in build_file(doc, threads=_PUT_HASH_THREADS):
                if stop.is_set():
                    return
                if block.cid.codec == RAW:
                    if not first_leaf:
                        first_leaf.append(block)
                    asyncio.run_coroutine_threadsafe(leaves.put(block), loop).result()
                else:
                    inner.append(block)
            item: Block | BaseException | None = None
        except BaseException as exc:  # handed to the loop, raised there
            item = exc
        asyncio.run_coroutine_threadsafe(leaves.put(item), loop).result()

    async def leaf_blocks() -> AsyncIterator[Block]:
        while True:
            block = await leaves.get()
            if block is None or isinstance(block, BaseException):
                leaves.put_nowait(block)  # the other streams end (or fail) too
                if block is None:
                    return
                raise block
            yield block
            sent[0] += len(block.data)
            if progress is not None and sent[0] - sent[1] >= PROGRESS_BYTES:
                progress(min(sent[0], doc.size), doc.size)
                sent[1] = sent[0]

    guarded = node.guarded_import() if isinstance(node, SupportsGuardedImport) else None

    async def send(blocks: AsyncIterable[Block]) -> None:
        if guarded is not None:
            await guarded.send(blocks)
        else:
            # any root will do: these CARs' roots are not pinned (the empty block: no leaf yet)
            await node.import_car(write_car_async([EMPTY_FILE.cid], blocks), pin_roots=False)

    worker = threading.Thread(target=produce, name="gradstore-put", daemon=True)
    worker.start()
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(_PUT_STREAMS):
                group.create_task(send(leaf_blocks()))
    except BaseExceptionGroup as group_error:
        raise group_error.exceptions[0] from None
    finally:
        stop.set()
        while not leaves.empty():  # let a producer blocked on a full queue finish
            leaves.get_nowait()
        await asyncio.to_thread(worker.join)
    root = inner[-1] if inner else first_leaf[0]  # one chunk: the leaf is the root
    if guarded is None:
        await _import_checked(node, root.cid, inner, pin)
    else:
        if len(inner) > 1:
            await guarded.send(_aiter(inner[:-1]))
        if not await guarded.finish(root, pin=pin):
            log.warning(
                "put %s: Kubo collected garbage during the upload; sending the DAG again", root.cid
            )
            blocks = await asyncio.to_thread(list, build_file(doc, threads=_PUT_HASH_THREADS))
            try:
                await _import_checked(node, root.cid, blocks, pin)
            except BaseException:
                await guarded.abandon()
                raise
    if progress is not None:
        progress(doc.size, doc.size)
    return root.cid


async def _put_small(
    node: Node, doc: EncodedDocument, *, pin: bool, progress: ByteProgress | None
) -> CID:
    """A small ``doc`` in one request: its blocks (zero-copy leaves) hashed in a thread,
    then one complete CAR naming its root, which the node pins."""
    blocks = await asyncio.to_thread(list, build_file(doc))
    root = blocks[-1].cid  # the last block is the root (one chunk: the leaf itself)
    await _import_checked(node, root, blocks, pin)
    if progress is not None:
        progress(doc.size, doc.size)
    return root


#: Builds the block that goes beside a small document, given the document's root.
Companion: TypeAlias = Callable[[CID], Block]


async def put_small_with(
    node: Node, doc: EncodedDocument, companion: Companion, *, pin: bool = True
) -> tuple[CID, Block] | None:
    """A small ``doc`` (at most ``ONE_REQUEST_BYTES``) and ``companion(root)`` in one CAR
    whose root, the document's, the node pins (the companion is stored, not pinned: pin it
    as it needs); the root and the companion block. None, storing nothing, for a larger
    ``doc``."""
    if doc.size > ONE_REQUEST_BYTES:
        return None
    blocks = await asyncio.to_thread(list, build_file(doc))
    root = blocks[-1].cid
    extra = companion(root)
    await _import_checked(node, root, [*blocks, extra], pin)
    return root, extra


async def _import_checked(node: Node, root: CID, blocks: Sequence[Block], pin: bool) -> None:
    """One CAR naming ``root``; the node pins it (its DAG is complete) and must report it."""
    # given whole (a list of views, no copy), a node may send it in one go (Kubo: a send)
    car = list(write_car([root], blocks))
    reported = await node.import_car(car, pin_roots=pin, complete=True)
    if reported != [root]:
        got = ", ".join(map(str, reported)) or "nothing"
        raise NodeError(f"node {node.name} imported {got}, expected root {root}")


async def _aiter(blocks: Sequence[Block]) -> AsyncIterator[Block]:
    for block in blocks:
        yield block
