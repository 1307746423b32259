"""One tensor -> its ``CompressedTensor``: the codec's payload of a float array."""

from __future__ import annotations

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
    for lo in range(0, flat.size, _CHECK_BLOCK):  # by blocks: no bool array of the tensor's size
        if not np.isfinite(flat[lo : lo + _CHECK_BLOCK]).all():
            raise CompressionError(f"{what} holds NaN or infinity")
    return CompressedTensor(codec, code, values.shape, _payload(flat, codec, what))


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
