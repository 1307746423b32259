"""numba code of the encoders that dominate compression time; imported by ``_fast`` only.

Each performs the same IEEE operations as its encoder's ``reference`` (no fused multiply-add, no
reassociation of anything but an exact maximum), so the bytes are the same with or
without numba.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

MIN_NORMAL32 = np.float32(np.finfo(np.float32).tiny)

Array = np.ndarray[Any, Any]


@numba.njit(nogil=True, cache=True, fastmath={"nnan", "ninf", "nsz", "reassoc"})
def _peak(x: Array, lo: int, hi: int) -> float:
    """``max |x[lo:hi]|`` (finite inputs): a maximum is exact in any order, so it may be
    vectorised; a zero's sign does not matter (its scale is +0.0 either way)."""
    peak = 0.0
    for j in range(lo, hi):
        peak = max(peak, abs(np.float64(x[j])))
    return peak


@numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
def int8_records(x: Array, block: int, out: Array) -> float:
    """The records (float32 scale, then int8 values) of the full blocks of ``x``, written into
    ``out`` (uint8); returns the largest ``max|x| / 127`` (the caller refuses one beyond
    float32)."""
    worst = 0.0
    size = block + 4
    scale = np.empty(1, np.float32)
    scale_bytes = scale.view(np.uint8)
    for b in range(out.size // size):
        lo = b * block
        quotient = _peak(x, lo, lo + block) / 127.0
        worst = max(worst, quotient)
        s = np.float32(quotient)
        if s < MIN_NORMAL32:
            s = np.float32(0.0)
        scale[0] = s
        base = b * size
        for i in range(4):
            out[base + i] = scale_bytes[i]
        record = out[base + 4 : base + size]
        if s == 0:
            record[:] = 0
            continue
        wide = np.float64(s)
        for j in range(block):
            v = np.rint(np.float64(x[lo + j]) / wide)
            v = min(max(v, -127.0), 127.0)
            record[j] = np.uint8(np.int32(v) & 0xFF)
    return worst


@numba.njit(nogil=True, cache=True, boundscheck=False)
def topk_select32(x: Array, chunk: int, kept: int, out: Array) -> None:
    """``topk_select`` for float32 ``x``, by radix selection on the magnitude bits.

    A float32's bits without the sign order like its magnitude, so the kept-th largest
    magnitude is found by three histograms (11, 11 and 9 bits) instead of a sort.
    """
    keys = np.empty(chunk, np.uint32)
    hist = np.empty(2048, np.int64)
    bits = x.view(np.uint32)
    for c in range(out.shape[0]):
        lo = c * chunk
        for j in range(chunk):
            keys[j] = bits[lo + j] & np.uint32(0x7FFFFFFF)
        need = kept
        prefix = np.uint32(0)
        fixed = np.uint32(0)
        shift, width = 20, 11
        for level in range(3):
            buckets = 1 << width
            hist[:buckets] = 0
            for j in range(chunk):
                k = keys[j]
                if (k & fixed) == prefix:
                    hist[(k >> shift) & (buckets - 1)] += 1
            b = buckets - 1
            while hist[b] < need:
                need -= hist[b]
                b -= 1
            prefix |= np.uint32(b) << shift
            fixed |= np.uint32(buckets - 1) << shift
            shift, width = (9, 11) if level == 0 else (0, 9)
        _collect(keys, prefix, need, out[c])


@numba.njit(nogil=True, cache=True, boundscheck=False)
def topk_select(x: Array, chunk: int, kept: int, out: Array) -> None:
    """For each full chunk c of ``x``: ``out[c]`` = positions of its ``kept`` largest
    magnitudes, ties to the lower position, ascending (any float dtype)."""
    mags = np.empty(chunk, np.float64)
    for c in range(out.shape[0]):
        lo = c * chunk
        for j in range(chunk):
            mags[j] = abs(np.float64(x[lo + j]))
        threshold = np.partition(mags, chunk - kept)[chunk - kept]  # the kept-th largest
        above = 0
        for j in range(chunk):
            if mags[j] > threshold:
                above += 1
        _collect(mags, threshold, kept - above, out[c])


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _collect(keys: Array, threshold: Any, ties: int, row: Array) -> None:
    """Positions of the keys above ``threshold``, and of the first ``ties`` equal to it."""
    n = 0
    for j in range(keys.size):
        k = keys[j]
        if k > threshold:
            row[n] = j
            n += 1
        elif k == threshold and ties > 0:
            row[n] = j
            n += 1
            ties -= 1
