"""The one rounding of every aggregate: a float64 block to the output dtype, to nearest, ties to even.

NumPy's casts from float64 to float16, float32 and float64 round once and correctly, so
they are used as they are. ``ml_dtypes``' casts to bfloat16 and float8 went through float32
before its 0.7 and rounded twice (``1 + 2**-8 + 2**-30`` becomes 1.0 instead of ``1 + 2**-7``), so those
are rounded here, exactly, in float64 arithmetic: scale by a power of two so the kept
bits are the integer part, ``rint`` (ties to even), scale back. The result is then
representable and the final cast changes nothing (docs/design/aggregation.md, "Narrow floats").
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

import numpy as np

from ..format import dtype_code


@dataclass(frozen=True)
class NarrowFloat:
    """A binary float format narrower than float32, as far as rounding needs it."""

    mantissa: int  # stored fraction bits
    min_exponent: int  # exponent of the smallest normal number (subnormals share its quantum)
    max: float  # the largest finite value
    overflow: float  # what a finite value beyond ``max`` becomes: inf, or NaN without inf


#: The narrow floats of the document format (cross-checked against ml_dtypes.finfo in tests).
NARROW: Final[dict[str, NarrowFloat]] = {
    "bfloat16": NarrowFloat(7, -126, float.fromhex("0x1.fep127"), math.inf),
    "float8_e4m3fn": NarrowFloat(3, -6, 448.0, math.nan),
    "float8_e5m2": NarrowFloat(2, -14, 57344.0, math.inf),
}


@cache
def narrow_format(dtype: np.dtype[Any]) -> NarrowFloat | None:
    """The rounding parameters of ``dtype`` if NumPy's own cast would not round it correctly."""
    code = dtype_code(dtype)
    return None if code is None else NARROW.get(code)


class _Buffers(threading.local):
    def __init__(self) -> None:
        self.scaled = np.empty(0, np.float64)
        self.exponents = np.empty(0, np.int32)


_buffers = _Buffers()


def round_into(
    dst: np.ndarray[Any, Any], acc: np.ndarray[Any, Any], divisor: float | None = None
) -> None:
    """``dst[...] = acc / divisor`` (float64) rounded once, to nearest with ties to even.

    ``acc`` is a contiguous float64 work block of ``dst``'s size and may be overwritten.
    A finite value beyond the format's range becomes its overflow value (inf, or NaN for
    float8_e4m3fn), which the kernels' finiteness checks then refuse.
    """
    fmt = narrow_format(dst.dtype)
    if fmt is None:  # NumPy's cast rounds once; dividing straight into dst is the same
        if divisor is None:
            np.copyto(dst, acc, casting="same_kind")
        else:
            np.divide(acc, divisor, dst, casting="same_kind")
        return
    if divisor is not None:
        np.divide(acc, divisor, acc)
    n = acc.size
    if _buffers.scaled.size < n:
        _buffers.scaled = np.empty(n, np.float64)
        _buffers.exponents = np.empty(n, np.int32)
    flat = acc.reshape(-1)  # a view: the accumulators are contiguous
    scaled, exponents = _buffers.scaled[:n], _buffers.exponents[:n]
    # acc = f * 2**e with 0.5 <= |f| < 1: its leading bit is worth 2**(e - 1), and the
    # last bit kept is worth 2**(max(e - 1, min_exponent) - mantissa) (subnormals: fixed).
    np.frexp(flat, out=(scaled, exponents))
    np.subtract(exponents, 1, out=exponents)
    np.maximum(exponents, fmt.min_exponent, out=exponents)
    np.subtract(exponents, fmt.mantissa, out=exponents)
    np.negative(exponents, out=exponents)
    np.ldexp(flat, exponents, out=scaled)  # exact: a power-of-two scaling
    np.rint(scaled, out=scaled)  # the one rounding: to nearest, ties to even
    np.negative(exponents, out=exponents)
    np.ldexp(scaled, exponents, out=flat)  # exact again; now representable in dst's format
    too_big = np.abs(flat, out=scaled) > fmt.max  # NaN compares False and stays NaN
    if too_big.any():
        flat[too_big] = np.copysign(fmt.overflow, flat[too_big])
    np.copyto(dst, flat.reshape(dst.shape), casting="same_kind")
