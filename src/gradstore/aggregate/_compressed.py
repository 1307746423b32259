"""Compressed inputs for the streamed engine: decompressed range by range, never whole.

A compressed input is read like any other (``InputSource.read``), its values decompressed
to float64 (docs/design/compression.md, "Aggregating compressed inputs"); a sparse one
(``topk``) also gives its kept entries (``SparseSource.read_sparse``), which the linear
methods add into their accumulator without densifying the input.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..format import Codec, CompressedGradient
from ._clip import NormSum, SquareSum
from ._declared import WINDOW

Array = np.ndarray[Any, Any]


@runtime_checkable
class Decompressing(Protocol):
    """A source whose float tensors arrive as float64 (decompressed), whatever their dtype."""

    codec: Codec


@runtime_checkable
class SparseSource(Protocol):
    """A source that can give a range's kept entries instead of its dense values."""

    codec: Codec

    async def read(self, name: str, start: int, stop: int) -> Array:
        """Elements ``start .. stop`` of tensor ``name``, decompressed (float64)."""
        ...

    async def read_sparse(self, name: str, start: int, stop: int) -> tuple[Array, Array]:
        """The kept entries of ``start .. stop``: positions relative to ``start`` (int64,
        ascending, unique) and their float64 values, never -0.0; every other element is +0.0."""
        ...


class CompressedInMemory:
    """An ``InputSource`` over a compressed gradient in memory."""

    def __init__(self, gradient: CompressedGradient) -> None:
        self.gradient = gradient
        self.codec = gradient.codec

    async def read(self, name: str, start: int, stop: int) -> Array:
        return self.gradient.tensors[name].read(start, stop)


class SparseInMemory(CompressedInMemory):
    """A ``SparseSource`` over a ``topk`` gradient in memory."""

    async def read_sparse(self, name: str, start: int, stop: int) -> tuple[Array, Array]:
        return self.gradient.tensors[name].sparse(start, stop)


def compressed_source(gradient: CompressedGradient) -> CompressedInMemory:
    """The in-memory source for ``gradient``: sparse when its codec is."""
    if gradient.codec.sparse:
        return SparseInMemory(gradient)
    return CompressedInMemory(gradient)


def compressed_norm(gradient: CompressedGradient, rule: NormSum = "sequential") -> float:
    """``global_norm`` of the decompressed gradient (the same bits), one window at a time."""
    squares = SquareSum(rule)
    work = np.empty(WINDOW, np.float64)
    for name in sorted(gradient.tensors):
        t = gradient.tensors[name]
        for lo in range(0, t.size, WINDOW):  # whole SquareSum blocks (WINDOW % BLOCK == 0)
            hi = min(t.size, lo + WINDOW)
            squares.add(t.read(lo, hi, work[: hi - lo]))
    return squares.norm()
