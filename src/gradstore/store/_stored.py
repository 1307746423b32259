"""A stored document read back piece by piece, every leaf verified, never whole in memory.

A coordinator that kept every verified input in memory until its round closed needed
peers x model of RAM. Instead it keeps them in its node and reads them back, tensor range
by tensor range, when the round is aggregated: ``StoredGradient.read(name, start, stop)``
returns elements of one tensor. The tensors' places in the document come from its
header (``format.read_header``), read when the input was verified; every leaf the range
touches is fetched and hashed against its CID before a byte of it is used, so the bytes
read back are exactly the verified document's.

Reads are meant to be sequential (tensors in document order, ranges ascending): the last
leaf read is kept, so consecutive ranges that share a leaf fetch it once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final, Protocol

import numpy as np

from ..dag import CID, Block, FileAssembler
from ..dag.assemble import LeafSpan
from ..dag.cid import RAW, verify_block
from ..errors import DAGError
from ..format import TensorInfo
from ..node import Node, SupportsCatInto

#: Leaves fetched at once while reading one range.
_CONCURRENT_LEAVES: Final = 4


class ByteRanges(Protocol):
    """A verified document read by byte ranges: from a node (``StoredDocument``) or from
    the coordinator's own spill file (``SpilledDocument``)."""

    size: int

    async def read_into(self, offset: int, out: np.ndarray[Any, Any]) -> None:
        """Fill ``out`` (uint8) with the document's bytes ``offset .. offset + len(out)``."""
        ...


class StoredDocument:
    """The leaves of one UnixFS file on a node, and verified reads of its byte ranges."""

    def __init__(self, node: Node, root: CID, size: int, leaves: list[LeafSpan]) -> None:
        self.node = node
        self.root = root
        self.size = size
        self.leaves = leaves
        self._starts = np.array([leaf.offset for leaf in leaves], dtype=np.int64)
        self._cached: tuple[int, bytes] | None = None  # (leaf index, verified bytes)

    @classmethod
    async def open(cls, node: Node, root: CID | str, max_bytes: int) -> StoredDocument:
        """Fetch ``root`` and its inner nodes (verified) and locate every leaf."""
        cid = CID.parse(root)
        assembler = FileAssembler(cid, max_bytes)
        first = await node.get_block(cid)
        await asyncio.to_thread(assembler.add, Block(cid, first))
        if cid.codec == RAW:  # a one-leaf document: the root is all of it
            doc = cls(node, cid, len(first), [LeafSpan(0, len(first), cid)])
            doc._cached = (0, bytes(first))
            return doc
        while True:
            spans = assembler.leaf_spans()
            if spans is not None:
                break
            nodes = [c for c in assembler.wanted() if c.codec != RAW]
            if not nodes:
                raise DAGError(f"file {cid} cannot be read by ranges (leaves inside its nodes)")
            blocks = await asyncio.gather(*(node.get_block(c) for c in nodes))
            for c, data in zip(nodes, blocks, strict=True):
                await asyncio.to_thread(assembler.add, Block(c, data))
        buffer = assembler.buffer
        assert buffer is not None
        return cls(node, cid, buffer.nbytes, spans)

    def forget(self) -> None:
        """Drop the leaf kept from the last read (a reader of many documents holds none)."""
        self._cached = None

    async def _leaf(self, index: int) -> bytes:
        if self._cached is not None and self._cached[0] == index:
            return self._cached[1]
        span = self.leaves[index]
        data = await self.node.get_block(span.cid)
        await asyncio.to_thread(verify_block, span.cid, data)
        if len(data) != span.size:
            raise DAGError(
                f"leaf {span.cid} has {len(data)} bytes, its parent declares {span.size}"
            )
        return data

    async def read_into(self, offset: int, out: np.ndarray[Any, Any]) -> None:
        """Fill ``out`` (uint8) with the file's bytes ``offset .. offset + len(out)``."""
        length = int(out.size)
        if offset < 0 or offset + length > self.size:
            raise ValueError(f"range {offset}+{length} is outside the {self.size}-byte file")
        if length == 0:
            return
        first = int(np.searchsorted(self._starts, offset, side="right")) - 1
        last = int(np.searchsorted(self._starts, offset + length - 1, side="right")) - 1
        if self._cached is not None and self._cached[0] == first and first < last:
            # the first leaf is the one kept from the last read: copy it, read the rest
            head = self.leaves[first]
            cut = head.offset + head.size - offset
            await self.read_into(offset, out[:cut])
            await self.read_into(offset + cut, out[cut:])
            return
        if last > first and isinstance(self.node, SupportsCatInto) and self.node.bulk_reads:
            await self._cat_into(first, last, offset, out)
            return
        indexes = list(range(first, last + 1))
        datas: list[bytes] = []
        for i in range(0, len(indexes), _CONCURRENT_LEAVES):
            part = indexes[i : i + _CONCURRENT_LEAVES]
            datas.extend(await asyncio.gather(*(self._leaf(j) for j in part)))
        for index, data in zip(indexes, datas, strict=True):
            span = self.leaves[index]
            lo = max(offset, span.offset)
            hi = min(offset + length, span.offset + span.size)
            src = np.frombuffer(data, dtype=np.uint8, count=hi - lo, offset=lo - span.offset)
            out[lo - offset : hi - offset] = src
        self._cached = (last, datas[-1])

    async def _cat_into(
        self, first: int, last: int, offset: int, out: np.ndarray[Any, Any]
    ) -> None:
        """Leaves ``first..last`` by one ranged ``cat`` into a scratch buffer, each leaf hashed
        there against its CID before its bytes are copied out."""
        assert isinstance(self.node, SupportsCatInto)
        start = self.leaves[first].offset
        end = self.leaves[last].offset + self.leaves[last].size
        scratch = np.empty(end - start, dtype=np.uint8)
        got = await self.node.cat_into(self.root, scratch.data, offset=start)
        if got != scratch.size:
            raise DAGError(f"file {self.root}: the node sent {got} of {scratch.size} bytes")

        def check() -> None:
            for span in self.leaves[first : last + 1]:
                lo = span.offset - start
                verify_block(span.cid, scratch[lo : lo + span.size].data)

        await asyncio.to_thread(check)
        length = int(out.size)
        out[:] = scratch[offset - start : offset - start + length]
        tail = self.leaves[last]
        self._cached = (last, scratch[tail.offset - start :].tobytes())


class StoredGradient:
    """An ``aggregate.InputSource`` over a verified document kept on a node."""

    def __init__(self, document: ByteRanges, tensors: Mapping[str, TensorInfo]) -> None:
        self.document = document
        self.tensors = dict(tensors)

    @classmethod
    async def open(
        cls, node: Node, root: CID | str, tensors: Mapping[str, TensorInfo], max_bytes: int
    ) -> StoredGradient:
        return cls(await StoredDocument.open(node, root, max_bytes), tensors)

    async def read(self, name: str, start: int, stop: int) -> np.ndarray[Any, Any]:
        """Elements ``start .. stop`` of tensor ``name``, as a 1-D array of its dtype."""
        info = self.tensors[name]
        dtype = info.array_dtype
        out = np.empty((stop - start) * dtype.itemsize, dtype=np.uint8)
        await self.document.read_into(info.offset + start * dtype.itemsize, out)
        return out.view(dtype)
