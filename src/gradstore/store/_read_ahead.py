"""A stored document read front to back by large ranges, kept in flight ahead of the reader.

The aggregation pass reads each input from its start to its end, a window at a time, every
input's window together. Reading each window by a ``cat`` of its own (``StoredDocument``)
leaves the node idle while a window is aggregated and makes every few MiB wait for the
slowest input. ``ReadAhead`` keeps up to ``depth`` leaf-aligned ranges of its document in
flight instead, ahead of the reader: each one ranged ``cat`` into a buffer of its own, each
leaf hashed against its CID by the thread that reads it, as soon as its last byte is in
(sha256 releases the GIL: other transfers go on meanwhile), so a range is verified when its
transfer ends and nothing unhashed is ever handed out. ``ReadAheadPool`` shares one byte
budget among the documents read together (ranges of ``budget / (documents x depth)``
bytes) and bounds the transfers in flight across them.

Reads that go back, or jump ahead of the ranges in flight, start over where they land: any
order is correct, front to back is fast.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from ..dag.assemble import LeafSpan
from ..dag.cid import verify_block
from ..errors import DAGError
from ..node import SupportsCatInto
from ._leaf_check import LeafCheck
from ._stored import ByteRanges, StoredDocument

#: Bytes of ranges held or in flight across the documents of one pool.
DEFAULT_BUDGET_BYTES: Final = 96 << 20

#: Ranges of one document in flight or held (the one being read, and those after it).
DEFAULT_DEPTH: Final = 2

#: Ranged ``cat`` transfers in flight across the pool's documents (each holds a thread of
#: the event loop's default pool while it reads and hashes; that pool has cores + 4, six
#: on two cores: one stays free for the aggregation's kernel).
DEFAULT_REQUESTS: Final = 5

#: The largest range: beyond it a request's own cost is lost in its transfer.
MAX_RANGE_BYTES: Final = 16 << 20


class ReadAheadPool:
    """The byte budget and the transfer limit shared by the documents read together."""

    def __init__(
        self,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        *,
        depth: int = DEFAULT_DEPTH,
        requests: int = DEFAULT_REQUESTS,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.depth = max(1, depth)
        self.members = 0  # documents reading through this pool
        self.transfers = asyncio.Semaphore(max(1, requests))
        self.requests = 0  # ranges asked for (each one ranged ``cat``), for the stats

    def range_bytes(self) -> int:
        """How many bytes a range may hold (a range is at least one leaf)."""
        share = self.budget_bytes // (max(1, self.members) * self.depth)
        return max(1, min(MAX_RANGE_BYTES, share))


def read_ahead(document: StoredDocument, pool: ReadAheadPool) -> ByteRanges:
    """``document`` read ahead through ``pool`` where ranged ``cat`` is the fast path (Kubo
    over plain http, a document of several leaves); else ``document`` itself."""
    node = document.node
    if len(document.leaves) > 1 and isinstance(node, SupportsCatInto) and node.bulk_reads:
        return ReadAhead(document, pool)
    return document


@dataclass
class _Range:
    """Bytes ``start .. end`` of the document (whole leaves), verified once ``task`` is done."""

    start: int
    end: int
    task: asyncio.Task[np.ndarray[Any, Any]]


class ReadAhead:
    """Verified byte ranges of one stored document (``ByteRanges``), read ahead of the reader."""

    def __init__(self, document: StoredDocument, pool: ReadAheadPool) -> None:
        self.document = document
        self.pool = pool
        self.size = document.size
        self._leaves = document.leaves
        self._starts = np.array([leaf.offset for leaf in self._leaves], dtype=np.int64)
        self._ranges: deque[_Range] = deque()
        self._next = 0  # the first leaf not yet asked for
        pool.members += 1

    def close(self) -> None:
        """Stop the transfers in flight and drop the ranges held."""
        while self._ranges:
            _drop(self._ranges.popleft())
        self._next = len(self._leaves)

    async def read_into(self, offset: int, out: np.ndarray[Any, Any]) -> None:
        """Fill ``out`` (uint8) with the document's bytes ``offset .. offset + len(out)``."""
        length = int(out.size)
        if offset < 0 or offset + length > self.size:
            raise ValueError(f"range {offset}+{length} is outside the {self.size}-byte file")
        if length == 0:
            return
        self._seek(offset)
        pos, end = offset, offset + length
        while pos < end:
            self._fill()
            head = self._ranges[0]
            try:
                data = await asyncio.shield(head.task)  # a cancelled reader leaves it running
            except BaseException:
                if head.task.done():  # it failed: a read after this starts over
                    self.close()
                raise
            hi = min(end, head.end)
            out[pos - offset : hi - offset] = data[pos - head.start : hi - head.start]
            pos = hi
            if hi == head.end:  # read to its end: its memory goes, the next one is asked for
                self._ranges.popleft()
        self._fill()

    def _seek(self, offset: int) -> None:
        """Drop the ranges before ``offset``; start over at its leaf if none in flight holds it."""
        while self._ranges and self._ranges[0].end <= offset:
            _drop(self._ranges.popleft())
        if not self._ranges or self._ranges[0].start > offset:
            self.close()
            self._next = int(np.searchsorted(self._starts, offset, side="right")) - 1

    def _fill(self) -> None:
        """Ask for the next ranges, up to the pool's depth."""
        limit = self.pool.range_bytes()
        while len(self._ranges) < self.pool.depth and self._next < len(self._leaves):
            first = last = self._next
            start = self._leaves[first].offset
            while (
                last + 1 < len(self._leaves)
                and self._leaves[last + 1].offset + self._leaves[last + 1].size - start <= limit
            ):
                last += 1
            spans = self._leaves[first : last + 1]
            end = spans[-1].offset + spans[-1].size
            task = asyncio.ensure_future(self._transfer(start, spans))
            self.pool.requests += 1
            self._ranges.append(_Range(start, end, task))
            self._next = last + 1

    async def _transfer(self, start: int, spans: list[LeafSpan]) -> np.ndarray[Any, Any]:
        """Leaves ``spans`` (contiguous, from ``start``) by one ranged ``cat``, each hashed
        against its CID by the reading thread as soon as it is complete."""
        node = self.document.node
        assert isinstance(node, SupportsCatInto)
        async with self.pool.transfers:
            buf = np.empty(spans[-1].offset + spans[-1].size - start, dtype=np.uint8)

            def hashed(span: LeafSpan) -> None:
                lo = span.offset - start
                verify_block(span.cid, buf[lo : lo + span.size].data)

            check = LeafCheck(spans, hashed, start)
            got = await node.cat_into(self.document.root, buf.data, offset=start, progress=check)
        if got != buf.size:
            raise DAGError(f"file {self.document.root}: the node sent {got} of {buf.size} bytes")
        if check.verified < len(spans):  # whatever the last progress call left
            await asyncio.to_thread(check, got)
        if check.verified != len(spans):
            raise DAGError(f"file {self.document.root}: leaves left unverified")
        return buf


def _drop(range_: _Range) -> None:
    """Stop a range's transfer (if still running) and never mind its outcome."""
    task = range_.task
    if not task.done():
        task.cancel()
    task.add_done_callback(_quiet)


def _quiet(task: asyncio.Task[Any]) -> None:
    with contextlib.suppress(BaseException):
        task.exception()
