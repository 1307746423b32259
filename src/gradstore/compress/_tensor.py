"""One tensor -> its ``CompressedTensor``: the codec's payload of a float array."""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

from ..errors import CompressionError
from ..format import FLOATS, Codec, CompressedTensor, dtype_code
from ._fast import int8_full_records, topk_full_chunks
from ._reference import int8_quantize, select, topk_records
from ._round import bf16_bits, fp16_values

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
    problem = overflow_problem(codec, code, peak)
    if problem is not None:
        raise CompressionError(f"{what}: {problem}")
    return CompressedTensor(codec, code, values.shape, _payload(flat, codec, what))


#: The smallest magnitude that bfloat16 rounds beyond float16's largest value (65504): 65408
#: is the tie between 65280 and 65536, and ties go to the even 65536.
_BF16_PAST_FLOAT16: Final = 65408.0
#: Magnitudes from here up may come back past float32's largest value: a block's scale is a
#: float32, rounded to nearest, so ``127 * scale`` may exceed the block's peak by 2^-24.
_SCALED_PAST_FLOAT32: Final = float(np.finfo(np.float32).max) * (1 - 2.0**-22)


def overflow_problem(codec: Codec, code: str, peak: float) -> str | None:
    """Why a tensor of dtype ``code`` whose largest magnitude is ``peak`` cannot be compressed
    with ``codec`` (its values would decompress beyond what ``code`` holds), or None.

    Only two cases exist: bfloat16 rounding of float16 values near 65504 (to 65536), and
    the float32 scales of int8 and 2-bit values near float32's largest. Everything else
    decompresses within the dtype, so ``get`` can always write what was stored.
    """
    rounds_to_bf16 = codec.name == "bf16" or (codec.name == "topk" and codec.values == "bf16")
    if rounds_to_bf16 and code == "<f2" and peak >= _BF16_PAST_FLOAT16:
        return (
            f"float16 values of magnitude {peak:g} round in bf16 to 65536, beyond float16's "
            "largest (65504): use fp16 or int8"
        )
    scaled = codec.name == "int8" or (codec.name == "topk" and codec.values in ("int8", "2bit"))
    if scaled and code == "<f4" and peak >= _SCALED_PAST_FLOAT32:
        return (
            f"values of magnitude {peak:g} sit at float32's largest, and the codec's float32 "
            "scale may bring them back beyond it: store this tensor uncompressed"
        )
    return None


def _payload(x: Array, codec: Codec, what: str) -> Array:
    if codec.name == "bf16":
        return bf16_bits(x, what).astype("<u2").view(np.uint8)
    if codec.name == "fp16":
        return fp16_values(x, what).astype("<f2").view(np.uint8)
    out = np.empty(codec.payload_nbytes(x.size), np.uint8)
    g = codec.group
    full = x.size // g
    size = codec.record_nbytes(g)
    records = out[: full * size].reshape(full, size)
    tail = x[full * g :].astype(np.float64).reshape(1, -1)
    if codec.name == "int8":
        int8_full_records(x, g, records, what)
        if tail.size:
            s, qt = int8_quantize(tail, what)
            out[full * size : full * size + 4] = s.astype("<f4").view(np.uint8)
            out[full * size + 4 :] = qt.view(np.uint8).reshape(-1)
        return out
    kept = codec.kept(g)
    if full:
        positions = topk_full_chunks(x, g, kept)
        rows = x[: full * g].reshape(full, g)
        records[:] = topk_records(codec, rows, positions, what)
    if tail.size:
        positions = select(tail, codec.kept(tail.size))
        out[full * size :] = topk_records(codec, tail, positions, what).reshape(-1)
    return out
