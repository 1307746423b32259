"""Compressed payloads, whatever their codec: the decoder's checks, the finite check, and
exact decompression of a range to float64, each the codec's own (``codecs``).

Everything works on the records of a range of elements (``Codec.span``), vectorised over
records with NumPy: a ``topk`` range costs work in proportion to the values it keeps, not
to its dense size. The rules are docs/spec.md's, section 2.3.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .codecs import Codec
from .codecs._records import CHECK_SCRATCH_BYTES, CHECK_WINDOW

Array = np.ndarray[Any, Any]

__all__ = [
    "CHECK_SCRATCH_BYTES",
    "CHECK_WINDOW",
    "payload_finite",
    "read_range",
    "sparse_range",
    "validate",
]


def validate(codec: Codec, payload: Array, count: int, path: str) -> None:
    """Every rule the design sets for ``codec``'s payload of ``count`` elements.

    ``payload`` is a 1-D uint8 array of exactly ``codec.payload_nbytes(count)`` bytes,
    checked window by window (``CHECK_WINDOW``). Raises InvalidDocumentError at ``path``
    naming the first record that breaks one.
    """
    codec.validate(payload, count, path)


def payload_finite(codec: Codec, payload: Array, count: int) -> bool:
    """Whether every value of a valid payload decompresses to a finite number.

    Scales and levels are finite by ``validate``'s rules, so only bfloat16 and float16
    values are looked at, by their exponent bits, window by window.
    """
    return codec.finite(payload, count)


def sparse_range(
    codec: Codec, buf: Array, count: int, first: int, start: int, stop: int
) -> tuple[Array, Array]:
    """Sparse codecs (``topk``): the kept entries of elements ``start..stop``: positions
    relative to ``start`` (int64, ascending) and float64 values."""
    return codec.sparse_range(buf, count, first, start, stop)


def read_range(
    codec: Codec,
    buf: Array,
    count: int,
    first: int,
    start: int,
    stop: int,
    out: Array | None = None,
) -> Array:
    """Elements ``start..stop`` decompressed to float64 (into ``out`` if given).

    ``buf`` holds the records from element ``first`` on (``Codec.span``)."""
    if out is None:
        out = np.empty(stop - start, np.float64)
    return codec.read(buf, count, first, start, stop, out)
