"""A stored compressed document read back range by range, decompressed, every leaf verified.

The compressed twin of ``StoredGradient``: elements ``start .. stop`` of a tensor are the
payload records that hold them (``Codec.span``, one contiguous slice), fetched through
``StoredDocument`` (each leaf hashed against its CID) and decompressed to float64. A
``topk`` document also gives a range's kept entries, so the aggregators add them without
densifying the input (docs/design/compression.md, "Aggregating compressed inputs").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..dag import CID
from ..format import Codec, TensorInfo, read_range, sparse_range
from ..node import Node
from ._stored import ByteRanges, StoredDocument

Array = np.ndarray[Any, Any]


class StoredCompressed:
    """An ``aggregate.InputSource`` over a verified gradstore/2 document kept on a node."""

    def __init__(
        self, document: ByteRanges, tensors: Mapping[str, TensorInfo], codec: Codec
    ) -> None:
        self.document = document
        self.tensors = dict(tensors)
        self.codec = codec

    @classmethod
    async def open(
        cls,
        node: Node,
        root: CID | str,
        tensors: Mapping[str, TensorInfo],
        codec: Codec,
        max_bytes: int,
    ) -> StoredCompressed:
        """The source for the document at ``root`` (a ``StoredSparse`` for ``topk``)."""
        document = await StoredDocument.open(node, root, max_bytes)
        kind = StoredSparse if codec.sparse else cls
        return kind(document, tensors, codec)

    async def _records(self, name: str, start: int, stop: int) -> tuple[TensorInfo, int, Array]:
        """The tensor's info, the first element of the records holding ``start..stop``, and
        those records' bytes (verified)."""
        info = self.tensors[name]
        count = int(np.prod(info.shape, dtype=np.int64))
        first, lo, hi = self.codec.span(count, start, stop)
        buf = np.empty(hi - lo, np.uint8)
        await self.document.read_into(info.offset + lo, buf)
        return info, first, buf

    async def read(self, name: str, start: int, stop: int) -> Array:
        """Elements ``start .. stop`` of tensor ``name``, decompressed to float64."""
        info, first, buf = await self._records(name, start, stop)
        count = int(np.prod(info.shape, dtype=np.int64))
        return read_range(self.codec, buf, count, first, start, stop)


class StoredSparse(StoredCompressed):
    """A ``StoredCompressed`` ``topk`` document: it also gives a range's kept entries."""

    async def read_sparse(self, name: str, start: int, stop: int) -> tuple[Array, Array]:
        """The kept entries of ``start .. stop``: positions relative to ``start``, values."""
        info, first, buf = await self._records(name, start, stop)
        count = int(np.prod(info.shape, dtype=np.int64))
        return sparse_range(self.codec, buf, count, first, start, stop)
