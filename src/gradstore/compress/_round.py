"""Rounding to bfloat16 and float16 once, to nearest with ties to even, from any float.

NumPy's casts to float16 round once and correctly; ``ml_dtypes``' casts from float64 to
bfloat16 went through float32 and rounded twice before its 0.7, so bfloat16 is rounded here: float32 input by
the usual integer trick on its bits, float64 input by scaling so the kept bits are the
integer part and ``rint`` (the method of ``aggregate/_rounding.py``), never via float32.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from ..errors import CompressionError

Array = np.ndarray[Any, Any]

_BF16_MAX: Final = float.fromhex("0x1.fep127")


def bf16_bits(x: Array, what: str) -> Array:
    """The bfloat16 bit patterns (uint16) nearest to the finite values ``x`` (ties to even).

    CompressionError naming ``what`` if a value rounds past bfloat16's range.
    """
    if x.dtype == np.float64:
        out = _round64(x)
        if out.size and np.abs(out).max() > _BF16_MAX:
            raise CompressionError(f"{what}: a value is beyond bfloat16's range")
        bits = out.astype(np.float32).view(np.uint32)  # exact: representable in bfloat16
        return (bits >> 16).astype(np.uint16)
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    if rounded.size and ((rounded & 0x7FFF) == 0x7F80).any():
        raise CompressionError(f"{what}: a value is beyond bfloat16's range")
    return rounded


def _round64(x: Array) -> Array:
    """float64 ``x`` rounded to bfloat16 precision (8 significant bits, exponent >= -126)."""
    scaled, exponents = np.frexp(x)
    np.subtract(exponents, 1, out=exponents)
    np.maximum(exponents, -126, out=exponents)
    np.subtract(exponents, 7, out=exponents)
    scaled = np.ldexp(x, -exponents)  # exact: a power-of-two scaling
    np.rint(scaled, out=scaled)  # the one rounding: to nearest, ties to even
    out: Array = np.ldexp(scaled, exponents)
    return out


def fp16_values(x: Array, what: str) -> Array:
    """``x`` rounded once to float16; CompressionError naming ``what`` if one overflows."""
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float32)  # exact for float16, bfloat16 and float8
    with np.errstate(over="ignore"):
        out = x.astype(np.float16)
    if out.size and not np.isfinite(out).all():
        raise CompressionError(f"{what}: a value is beyond float16's range (try bf16)")
    return out
