"""Compressed payloads: the decoder's strict checks, and exact decompression to float64.

Everything here works on the records of a range of elements (``Codec.span``), vectorised
over records with NumPy: a ``topk`` range costs work in proportion to the values it
keeps, not to its dense size. The rules are docs/design.md's "Compressed updates".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import numpy as np

from ..errors import InvalidDocumentError
from ._codec import Codec

Array = np.ndarray[Any, Any]

#: The smallest normal float32: a non-zero scale is at least this.
MIN_NORMAL32: Final = float(np.finfo(np.float32).tiny)

_F64: Final = np.dtype(np.float64)
_SHIFTS2: Final = np.array([0, 2, 4, 6], np.uint8)


def groups(codec: Codec, count: int, first: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
    """``(byte offset, records, elements per record, first element)`` of the runs of equal
    records that hold elements ``first..stop`` (``first`` at a record boundary)."""
    g = codec.group
    full_end = count // g * g
    end = min(count, -(-stop // g) * g)
    offset = 0
    if first < min(end, full_end):
        n = (min(end, full_end) - first) // g
        yield offset, n, g, first
        offset += n * codec.record_nbytes(g)
    if end > full_end and count > full_end:
        yield offset, 1, count - full_end, full_end


def _rows(buf: Array, offset: int, n: int, size: int) -> Array:
    """``n`` records of ``size`` bytes from ``offset``: an (n, size) uint8 view."""
    return buf[offset : offset + n * size].reshape(n, size)


def _f32(raw: Array) -> Array:
    """Little-endian float32s from an (n, 4m) uint8 view."""
    return np.ascontiguousarray(raw).view("<f4")


# -- checks ---------------------------------------------------------------------------


#: Payload bytes checked at a time, so what the checks hold stays bounded whatever the
#: document's size (checked whole, a topk payload cost up to 16 times its size at once).
CHECK_WINDOW: Final = 1 << 20

#: The most ``validate`` holds beside a payload: up to ~16 bytes per byte of its window (a
#: 12-bit position of 1.5 bytes unpacks to 8 bytes of int64, then to its difference).
CHECK_SCRATCH_BYTES: Final = 20 * CHECK_WINDOW


def validate(codec: Codec, payload: Array, count: int, path: str) -> None:
    """Every rule the design sets for ``codec``'s payload of ``count`` elements.

    ``payload`` is a 1-D uint8 array of exactly ``codec.payload_nbytes(count)`` bytes,
    checked window by window (``CHECK_WINDOW``). Raises InvalidDocumentError at ``path``
    naming the first record that breaks one.
    """
    if codec.name in ("bf16", "fp16"):
        return  # every 16-bit pattern is a value (NaN/Inf are the coordinator's to refuse)
    for rows, length, where in _windows(codec, payload, count):
        if codec.name == "int8":
            _check_int8(rows[:, :4], rows[:, 4:].view(np.int8), where, path)
        else:
            _check_topk(codec, rows, codec.kept(length), length, where, path)


def payload_finite(codec: Codec, payload: Array, count: int) -> bool:
    """Whether every value of a valid payload decompresses to a finite number.

    Scales and levels are finite by ``validate``'s rules, so only bfloat16 and float16
    values are looked at, by their exponent bits, window by window.
    """
    if codec.name in ("bf16", "fp16"):
        exponent = 0x7F80 if codec.name == "bf16" else 0x7C00
        bits = payload.view("<u2")
        step = CHECK_WINDOW // 2
        return not any(
            ((bits[lo : lo + step] & exponent) == exponent).any()
            for lo in range(0, bits.size, step)
        )
    if codec.name == "topk" and codec.values == "bf16":
        for rows, length, _ in _windows(codec, payload, count):
            bits = np.ascontiguousarray(rows[:, : codec.value_nbytes(codec.kept(length))])
            if ((bits.view("<u2") & 0x7F80) == 0x7F80).any():
                return False
    return True


def _windows(codec: Codec, payload: Array, count: int) -> Iterator[tuple[Array, int, int]]:
    """``(rows, elements per record, index of the first record)``: the payload's records,
    at most ``CHECK_WINDOW`` bytes of them at a time (at least one)."""
    for offset, n, length, first in groups(codec, count, 0, count):
        size = codec.record_nbytes(length)
        step = max(1, CHECK_WINDOW // size)
        for lo in range(0, n, step):
            rows = _rows(payload, offset + lo * size, min(step, n - lo), size)
            yield rows, length, first // codec.group + lo


def _fail(message: str, bad: Array, where: int, what: str, path: str) -> None:
    """Raise for the first True of ``bad`` (one per record), if any."""
    if bad.any():
        index = where + int(np.argmax(bad))
        raise InvalidDocumentError(f"{what} {index}: {message}", path)


def _check_scales(raw: Array, where: int, what: str, path: str) -> Array:
    """The (n,) float32 scales of (n, 4) bytes, each finite, +0.0 or a normal positive number."""
    scales = _f32(raw)[:, 0]
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(scales) & ~np.signbit(scales) & ((scales == 0) | (scales >= MIN_NORMAL32))
    _fail("its scale must be +0.0 or a finite normal float32 > 0", ~ok, where, what, path)
    return scales


def _check_int8(raw_scales: Array, q: Array, where: int, path: str, what: str = "block") -> None:
    scales = _check_scales(raw_scales, where, what, path)
    _fail("holds -128 (int8 values are -127..127)", (q == -128).any(axis=1), where, what, path)
    peak = np.abs(q).max(axis=1) if q.shape[1] else np.zeros(q.shape[0], np.int8)
    _fail("a zero scale with non-zero values", (scales == 0) & (peak != 0), where, what, path)
    _fail(
        "a non-zero scale needs a value of magnitude 127 (scale = max |x| / 127)",
        (scales != 0) & (peak != 127),
        where,
        what,
        path,
    )


def _check_topk(codec: Codec, rows: Array, kept: int, length: int, where: int, path: str) -> None:
    header = codec.header_nbytes()
    values = rows[:, header : header + codec.value_nbytes(kept)]
    raw_index = rows[:, header + codec.value_nbytes(kept) :]
    positions, pad = _positions(raw_index, kept, codec.index == 12)
    _fail("the padding bits of its positions must be zero", pad, where, "chunk", path)
    ascending = np.asarray((np.diff(positions, axis=1) > 0).all(axis=1))
    _fail("positions must be strictly ascending", ~ascending, where, "chunk", path)
    _fail(
        f"a position is outside its chunk of {length} elements",
        positions[:, -1] >= length,
        where,
        "chunk",
        path,
    )
    if codec.values == "bf16":
        bits = np.ascontiguousarray(values).view("<u2")
        _fail(
            "a zero value is written -0.0 (write +0.0)",
            (bits == 0x8000).any(axis=1),
            where,
            "chunk",
            path,
        )
    elif codec.values == "int8":
        _check_int8(rows[:, :4], values.view(np.int8), where, path, "chunk")
    else:
        _check_levels(rows[:, :8], values, kept, where, path)


def _check_levels(raw: Array, packed: Array, kept: int, where: int, path: str) -> None:
    levels = _f32(raw)
    lo, hi = levels[:, 0], levels[:, 1]
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(levels).all(axis=1) & ~np.signbit(levels).any(axis=1) & (lo <= hi)
    _fail("its levels must be finite, >= +0.0 and lo <= hi", ~ok, where, "chunk", path)
    codes = _codes(packed)
    _fail(
        "the padding bits of its codes must be zero",
        (codes[:, kept:] != 0).any(axis=1),
        where,
        "chunk",
        path,
    )
    codes = codes[:, :kept]
    high = (codes & 1) != 0
    uses_high = high.any(axis=1)
    _fail("lo == hi, so every code uses level 0", (lo == hi) & uses_high, where, "chunk", path)
    _fail(
        "lo < hi, so both levels are used",
        (lo < hi) & ~(uses_high & (~high).any(axis=1)),
        where,
        "chunk",
        path,
    )
    zero = np.where(high, hi[:, None] == 0, lo[:, None] == 0)
    _fail(
        "a code of level 0.0 must have sign 0",
        (zero & ((codes & 2) != 0)).any(axis=1),
        where,
        "chunk",
        path,
    )


def _codes(packed: Array) -> Array:
    """2-bit codes, four per byte, the first in the lowest bits: (n, 4 * bytes) uint8."""
    n = packed.shape[0]
    return ((packed[:, :, None] >> _SHIFTS2) & 3).reshape(n, -1)


def _positions(raw: Array, kept: int, twelve: bool) -> tuple[Array, Array]:
    """Positions (n, kept) int64 from their packed bytes, and which records have pad bits set."""
    n = raw.shape[0]
    if not twelve:
        return np.ascontiguousarray(raw).view("<u2").astype(np.int64), np.zeros(n, bool)
    b = raw.astype(np.int64)
    pairs = kept // 2
    trip = b[:, : 3 * pairs].reshape(n, pairs, 3)
    out = np.empty((n, kept), np.int64)
    out[:, 0 : 2 * pairs : 2] = trip[:, :, 0] | ((trip[:, :, 1] & 0xF) << 8)
    out[:, 1 : 2 * pairs : 2] = (trip[:, :, 1] >> 4) | (trip[:, :, 2] << 4)
    if kept % 2:
        tail = b[:, 3 * pairs : 3 * pairs + 2]
        out[:, -1] = tail[:, 0] | ((tail[:, 1] & 0xF) << 8)
        return out, (tail[:, 1] >> 4) != 0
    return out, np.zeros(n, bool)


# -- decompression ----------------------------------------------------------------------


def _topk_values(codec: Codec, rows: Array, kept: int) -> Array:
    """The kept values of each record, exactly as float64: (n, kept)."""
    header = codec.header_nbytes()
    values = rows[:, header : header + codec.value_nbytes(kept)]
    if codec.values == "bf16":
        bits = np.ascontiguousarray(values).view("<u2").astype(np.uint32) << 16
        with np.errstate(invalid="ignore"):  # a signalling NaN widens to a quiet one
            return bits.view(np.float32).astype(_F64)
    if codec.values == "int8":
        scales = _f32(rows[:, :4]).astype(_F64)
        return np.multiply(values.view(np.int8), scales, dtype=_F64)
    levels = _f32(rows[:, :8]).astype(_F64)
    codes = _codes(values)[:, :kept]
    magnitude = np.where((codes & 1) != 0, levels[:, 1:2], levels[:, 0:1])
    return np.where((codes & 2) != 0, -magnitude, magnitude)


def topk_entries(
    codec: Codec, buf: Array, count: int, first: int, stop: int
) -> tuple[Array, Array]:
    """The kept ``(positions, values)`` of the records from element ``first`` (where ``buf``,
    a ``Codec.span`` slice, starts) up to the one holding ``stop - 1``: positions absolute,
    ascending, int64; values float64."""
    positions: list[Array] = []
    values: list[Array] = []
    for offset, n, length, start in groups(codec, count, first, stop):
        kept = codec.kept(length)
        rows = _rows(buf, offset, n, codec.record_nbytes(length))
        header = codec.header_nbytes() + codec.value_nbytes(kept)
        pos, _ = _positions(rows[:, header:], kept, codec.index == 12)
        pos += (start + length * np.arange(n, dtype=np.int64))[:, None]
        positions.append(pos.reshape(-1))
        values.append(_topk_values(codec, rows, kept).reshape(-1))
    if not positions:
        return np.empty(0, np.int64), np.empty(0, _F64)
    if len(positions) == 1:
        return positions[0], values[0]
    return np.concatenate(positions), np.concatenate(values)


def sparse_range(
    codec: Codec, buf: Array, count: int, first: int, start: int, stop: int
) -> tuple[Array, Array]:
    """``topk``: the kept entries of elements ``start..stop``: positions relative to
    ``start`` (int64, ascending) and float64 values."""
    positions, values = topk_entries(codec, buf, count, first, stop)
    if first < start or (positions.size and positions[-1] >= stop):
        keep = (positions >= start) & (positions < stop)
        positions, values = positions[keep], values[keep]
    return positions - start, values


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
        out = np.empty(stop - start, _F64)
    if codec.name in ("bf16", "fp16"):
        raw = buf[2 * (start - first) : 2 * (stop - first)]
        with np.errstate(invalid="ignore"):  # a signalling NaN widens to a quiet one
            if codec.name == "fp16":
                np.copyto(out, raw.view("<f2"), casting="safe")
            else:
                bits = raw.view("<u2").astype(np.uint32) << 16
                np.copyto(out, bits.view(np.float32), casting="safe")
        return out
    if codec.name == "topk":
        positions, values = sparse_range(codec, buf, count, first, start, stop)
        out.fill(0.0)
        out[positions] = values
        return out
    g = codec.group
    end = min(count, -(-stop // g) * g)
    direct = first == start and end == stop
    dense = out if direct else np.empty(end - first, _F64)
    for offset, n, length, at in groups(codec, count, first, stop):
        rows = _rows(buf, offset, n, 4 + length)
        scales = _f32(rows[:, :4]).astype(_F64)
        target = dense[at - first : at - first + n * length].reshape(n, length)
        np.multiply(rows[:, 4:].view(np.int8), scales, out=target, dtype=_F64)
    if not direct:
        out[:] = dense[start - first : stop - first]
    return out
