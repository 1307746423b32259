"""One tensor -> its ``CompressedTensor``: the codec's payload of a float array, written by
the codec's encoder (``encoders``)."""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

from ..errors import CompressionError
from ..format import FLOATS, Codec, CompressedTensor, dtype_code
from .encoders import encoder_for

Array = np.ndarray[Any, Any]

_CHECK_BLOCK: Final = 1 << 20


def compress_array(
    values: Array, codec: Codec, name: str, code: str | None = None
) -> CompressedTensor:
    """``values`` compressed with ``codec``; it stands for a tensor of dtype ``code`` (default:
    the array's own) and the array's shape.

    CompressionError for a non-float array, NaN/Inf, or a value beyond the codec's range.
    """
    what = f"tensor {name!r}"
    if not isinstance(values, np.ndarray | np.generic):
        raise CompressionError(f"{what} is a {type(values).__name__}, not a NumPy array")
    values = np.asarray(values)
    own = dtype_code(values.dtype)
    if own not in FLOATS:
        raise CompressionError(
            f"{what} has dtype {own or values.dtype}; only float tensors are compressed"
        )
    code = own if code is None else code
    if code not in FLOATS:
        raise CompressionError(f"{what}: dtype {code} is not a float dtype")
    flat = np.ravel(values)
    # native float64, or float32 (exact for every narrower float), whatever the byte order
    flat = flat.astype(np.float64 if flat.dtype.itemsize == 8 else np.float32, copy=False)
    peak = 0.0
    for lo in range(0, flat.size, _CHECK_BLOCK):  # by blocks: no temporary of the tensor's size
        block = flat[lo : lo + _CHECK_BLOCK]
        hi, low = float(block.max()), float(block.min())  # NaN propagates through both
        if not (math.isfinite(hi) and math.isfinite(low)):
            raise CompressionError(f"{what} holds NaN or infinity")
        peak = max(peak, hi, -low)
    encoder = encoder_for(codec)
    problem = encoder.overflow_problem(codec, code, peak)
    if problem is not None:
        raise CompressionError(f"{what}: {problem}")
    return CompressedTensor(codec, code, values.shape, encoder.encode(codec, flat, what))


def overflow_problem(codec: Codec, code: str, peak: float) -> str | None:
    """Why a tensor of dtype ``code`` whose largest magnitude is ``peak`` cannot be compressed
    with ``codec`` (its values would decompress beyond what ``code`` holds), or None.

    Only two cases exist: bfloat16 rounding of float16 values near 65504 (to 65536), and
    the float32 scales of int8 and 2-bit values near float32's largest (each encoder's
    ``overflow_problem``). Everything else decompresses within the dtype, so ``get`` can
    always write what was stored.
    """
    return encoder_for(codec).overflow_problem(codec, code, peak)
