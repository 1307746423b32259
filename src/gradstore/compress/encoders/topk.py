"""The ``topk`` encoder: each chunk's largest magnitudes (ties to the lower position), their
values as the codec's value format says, and their positions packed.

The NumPy definition (``select``, ``topk_records``) and the compiled selection of full
chunks (``_kernels.topk_select``, ``topk_select32``) keep the same positions.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from ...errors import CompressionError
from ...format.codecs import TopK
from .._fast import kernels_for
from .._round import bf16_bits
from .base import Encoder, bf16_past_float16, records, scaled_past_float32
from .int8 import int8_quantize

Array = np.ndarray[Any, Any]

_F32_MAX: Final = float(np.finfo(np.float32).max)


class TopKEncoder(Encoder[TopK]):
    """Chunked top-k, full chunks selected by compiled code when it pays."""

    codec = TopK

    def reference(self, codec: TopK, x: Array, what: str) -> Array:
        return _payload(codec, x, what, None)

    def encode(self, codec: TopK, x: Array, what: str) -> Array:
        return _payload(codec, x, what, kernels_for(x.size))

    def overflow_problem(self, codec: TopK, code: str, peak: float) -> str | None:
        if codec.values == "bf16":
            return bf16_past_float16(code, peak)
        return scaled_past_float32(code, peak)  # int8 and 2bit values have float32 scales


def _payload(codec: TopK, x: Array, what: str, kernels: Any) -> Array:
    out, full, tail = records(codec, x)
    n = full.shape[0]
    if n:
        positions = _full_chunks(x, codec.chunk, codec.kept(codec.chunk), n, kernels)
        full[:] = topk_records(codec, x[: n * codec.chunk].reshape(n, codec.chunk), positions, what)
    if tail.size:
        positions = select(tail, codec.kept(tail.size))
        out[full.size :] = topk_records(codec, tail, positions, what).reshape(-1)
    return out


def _full_chunks(x: Array, chunk: int, kept: int, n: int, kernels: Any) -> Array:
    """Positions (n, kept) kept in each of the ``n`` full chunks of ``x``."""
    if kernels is None:
        return select(x[: n * chunk].reshape(n, chunk).astype(np.float64), kept)
    out = np.empty((n, kept), np.int64)
    if x.dtype == np.float32:
        kernels.topk_select32(x, chunk, kept, out)
    else:
        kernels.topk_select(x, chunk, kept, out)
    return out


def select(rows: Array, kept: int) -> Array:
    """Per row, the positions of its ``kept`` largest magnitudes (ties: lower position),
    ascending: (n, kept) int64."""
    order = np.argsort(-np.abs(rows), axis=1, kind="stable")[:, :kept]
    return np.sort(order, axis=1)


def topk_records(codec: TopK, rows: Array, positions: Array, what: str) -> Array:
    """The (n, record bytes) records of chunks ``rows`` (n, length) keeping ``positions``."""
    n = rows.shape[0]
    kept = positions.shape[1]
    values = np.take_along_axis(rows, positions, axis=1).astype(np.float64)
    parts: list[Array] = []
    if codec.values == "bf16":
        bits = bf16_bits(values.reshape(-1), what).reshape(n, kept)
        bits[bits == 0x8000] = 0  # a zero is written +0.0
        parts.append(bits.astype("<u2").view(np.uint8).reshape(n, 2 * kept))
    elif codec.values == "int8":
        scales, q = int8_quantize(values, what)
        parts += [scales.astype("<f4").view(np.uint8).reshape(n, 4), q.view(np.uint8)]
    else:
        levels, codes = two_bit(values, what)
        parts += [levels.astype("<f4").view(np.uint8).reshape(n, 8), pack_codes(codes)]
    parts.append(pack_positions(positions, codec.index == 12))
    return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]


def two_bit(values: Array, what: str) -> tuple[Array, Array]:
    """Per row of kept values: the levels (n, 2) float32 ``lo, hi`` and the codes (n, kept)."""
    mags = np.abs(values)
    a, b = mags.min(axis=1), mags.max(axis=1)
    mid = a + 0.5 * (b - a)  # >= a: the smallest is always in the low group
    high = mags > mid[:, None]
    n_high = high.sum(axis=1)
    n_low = values.shape[1] - n_high
    # sums in position order (cumsum is a running sum), then the mean, then float32
    low_sum = np.cumsum(np.where(high, 0.0, mags), axis=1)[:, -1]
    high_sum = np.cumsum(np.where(high, mags, 0.0), axis=1)[:, -1]
    lo64 = low_sum / n_low
    hi64 = np.where(n_high > 0, high_sum / np.maximum(n_high, 1), lo64)
    if max(lo64.max(initial=0.0), hi64.max(initial=0.0)) > _F32_MAX:
        raise CompressionError(f"{what}: a value is too large for a 2-bit level (float32)")
    levels = np.stack([lo64, hi64], axis=1).astype(np.float32)
    same = levels[:, 0] == levels[:, 1]
    high &= ~same[:, None]
    level_value = np.where(high, levels[:, 1:2], levels[:, 0:1])
    negative = (values < 0) & (level_value != 0)
    codes = high.astype(np.uint8) | (negative.astype(np.uint8) << 1)
    return levels, codes


def pack_positions(positions: Array, twelve: bool) -> Array:
    """(n, kept) positions as (n, index bytes) uint8: 12-bit packed or 16-bit little-endian."""
    n, kept = positions.shape
    if not twelve:
        return positions.astype("<u2").view(np.uint8).reshape(n, 2 * kept)
    p = positions.astype(np.uint16)
    pairs = kept // 2
    out = np.zeros((n, (3 * kept + 1) // 2), np.uint8)
    even, odd = p[:, 0 : 2 * pairs : 2], p[:, 1 : 2 * pairs : 2]
    trip = out[:, : 3 * pairs].reshape(n, pairs, 3)
    trip[:, :, 0] = even & 0xFF
    trip[:, :, 1] = (even >> 8) | ((odd & 0xF) << 4)
    trip[:, :, 2] = odd >> 4
    if kept % 2:
        last = p[:, -1]
        out[:, 3 * pairs] = last & 0xFF
        out[:, 3 * pairs + 1] = last >> 8
    return out


def pack_codes(codes: Array) -> Array:
    """(n, kept) 2-bit codes as (n, ceil(kept / 4)) bytes, the first in the lowest bits."""
    n, kept = codes.shape
    padded = np.zeros((n, -(-kept // 4) * 4), np.uint8)
    padded[:, :kept] = codes
    quads = padded.reshape(n, -1, 4)
    out: Array = (
        quads[:, :, 0] | (quads[:, :, 1] << 2) | (quads[:, :, 2] << 4) | (quads[:, :, 3] << 6)
    )
    return out
