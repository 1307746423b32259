"""GradientStore: gradients in, CIDs out, and every fetched block verified before use.

put streams the canonical document through the chunker and DAG builder and
sends one CAR to the node (root pinned), then checks that the node reports the
locally computed root.  get streams the node's CAR export, verifies every
block against its CID while writing leaf data into one preallocated buffer,
and only then decodes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ..dag import CID, Block, CarReader, FileAssembler, build_file, file_cid, write_car
from ..errors import IntegrityError, NodeError
from ..format import DEFAULT_LIMITS, EncodedDocument, Gradient, Limits, decode, encode, read_header
from ..node import Node
from ._threaded import iterate_in_thread

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) as a transfer advances."""

_BATCH_BYTES = 8 << 20  # blocks handed between the hashing thread and the loop per step


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
        self, gradient: Gradient, *, pin: bool = True, progress: Progress | None = None
    ) -> CID:
        """Store ``gradient`` on the node (pinned by default) and return its CID."""
        return await self.put_document(encode(gradient), pin=pin, progress=progress)

    async def put_document(
        self, doc: EncodedDocument, *, pin: bool = True, progress: Progress | None = None
    ) -> CID:
        """Store an encoded document; the root is computed locally first and must match the node's."""
        root = await asyncio.to_thread(file_cid, doc)
        body = self._car_stream(root, doc, progress)
        reported = await self.node.import_car(body, pin_roots=pin)
        if reported != [root]:
            got = ", ".join(map(str, reported)) or "nothing"
            raise NodeError(f"node {self.node.name} imported {got}, expected root {root}")
        return root

    async def _car_stream(
        self, root: CID, doc: EncodedDocument, progress: Progress | None
    ) -> AsyncIterator[bytes | memoryview]:
        """The CAR of ``doc``, built and hashed in a worker thread, streamed from the loop."""
        last: list[CID] = []

        def blocks() -> Iterator[Block]:
            for block in build_file(doc):
                last[:] = [block.cid]
                yield block

        def batches() -> Iterator[list[bytes | memoryview]]:
            batch: list[bytes | memoryview] = []
            size = 0
            for piece in write_car([root], blocks()):
                batch.append(piece)
                size += len(piece)
                if size >= _BATCH_BYTES:
                    yield batch
                    batch, size = [], 0
            yield batch

        sent = 0
        async for batch in iterate_in_thread(batches):
            for piece in batch:
                yield piece
                sent += len(piece)
            if progress is not None:
                progress(min(sent, doc.size), doc.size)
        if last != [root]:
            raise IntegrityError(root, f"document changed while it was being stored (root {root})")

    # -- get ---------------------------------------------------------------
    async def fetch_document(
        self, cid: CID | str, *, max_bytes: int | None = None, progress: Progress | None = None
    ) -> np.ndarray:
        """Fetch the file bytes of ``cid``, every block verified, into one buffer."""
        root = CID.parse(cid)
        limit = self.limits.max_bytes if max_bytes is None else max_bytes
        assembler = FileAssembler(root, limit)
        reader = CarReader()
        pending: list[Block] = []
        pending_bytes = received = 0
        async for chunk in self.node.export_car(root):
            received += len(chunk)
            for block in reader.feed(chunk):
                pending.append(block)
                pending_bytes += len(block.data)
            if pending_bytes >= _BATCH_BYTES:
                await asyncio.to_thread(_add_all, assembler, pending)
                pending, pending_bytes = [], 0
                if progress is not None:
                    progress(received, 0)
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
        """Fetch, verify and decode the gradient at ``cid`` (zero-copy views into one buffer)."""
        lim = limits or self.limits
        buf = await self.fetch_document(cid, max_bytes=lim.max_bytes, progress=progress)
        return decode(buf, lim)

    async def verify(self, cid: CID | str) -> VerifyReport:
        """Fetch every block, check its hash, decode strictly and recompute the root CID."""
        start = time.perf_counter()
        root = CID.parse(cid)
        buf = await self.fetch_document(root)
        gradient = decode(buf, self.limits)
        again = await asyncio.to_thread(file_cid, encode(gradient))
        if again != root.to_v1():
            raise IntegrityError(
                root, f"re-encoding {root} gives {again}: not a canonical gradstore/1 document"
            )
        header = read_header(buf, self.limits)
        blocks = 1 if root.codec == 0x55 else 1 + -(-int(buf.size) // (1 << 20))
        return VerifyReport(
            root, int(buf.size), blocks, len(header.tensors), time.perf_counter() - start
        )

    async def unpin(self, cid: CID | str) -> None:
        """Drop the recursive pin of ``cid`` (its blocks may then be garbage collected)."""
        await self.node.unpin(CID.parse(cid))


def _add_all(assembler: FileAssembler, blocks: list[Block]) -> None:
    for block in blocks:
        assembler.add(block)
