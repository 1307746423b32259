"""numba code of the two encoders that dominate compression time; imported by ``_fast`` only.

Each performs the same IEEE operations as ``_reference`` (no fast-math, no fused
multiply-add), so the bytes are the same with or without numba.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

MIN_NORMAL32 = np.float32(np.finfo(np.float32).tiny)


@numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
def int8_blocks(
    x: np.ndarray[Any, Any], block: int, scales: np.ndarray[Any, Any], q: np.ndarray[Any, Any]
) -> float:
    """Full blocks of ``x``: ``scales[b]`` and ``q[b*block:(b+1)*block]``; returns the largest
    ``max|x| / 127`` seen (the caller refuses one beyond float32)."""
    worst = 0.0
    for b in range(scales.size):
        lo = b * block
        peak = 0.0
        for j in range(lo, lo + block):
            a = abs(np.float64(x[j]))
            if a > peak:
                peak = a
        quotient = peak / 127.0
        if quotient > worst:
            worst = quotient
        s = np.float32(quotient)
        if s < MIN_NORMAL32:
            s = np.float32(0.0)
        scales[b] = s
        if s == 0:
            for j in range(lo, lo + block):
                q[j] = 0
            continue
        wide = np.float64(s)
        for j in range(lo, lo + block):
            v = np.rint(np.float64(x[j]) / wide)
            if v > 127.0:
                v = 127.0
            elif v < -127.0:
                v = -127.0
            q[j] = np.int8(v)
    return worst


@numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
def topk_select(x: np.ndarray[Any, Any], chunk: int, kept: int, out: np.ndarray[Any, Any]) -> None:
    """For each full chunk c of ``x``: ``out[c]`` = positions of its ``kept`` largest
    magnitudes, ties to the lower position, ascending."""
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
        ties = kept - above  # how many equal to the threshold are kept: the first ones
        n = 0
        for j in range(chunk):
            m = mags[j]
            if m > threshold:
                out[c, n] = j
                n += 1
            elif m == threshold and ties > 0:
                out[c, n] = j
                n += 1
                ties -= 1
