"""``first_beyond_dtype``: the one check (``get``'s and every input verifier's) that no
compressed value comes back beyond its tensor's declared dtype (issue 23, R1).

The documents are hostile by hand: ``compress`` refuses the inputs that would give them.
"""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

from gradstore.aggregate import first_beyond_dtype
from gradstore.aggregate._declared import WINDOW
from gradstore.format import Codec, CompressedTensor, numpy_dtype

F32_MAX = float(np.finfo(np.float32).max)


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def i8(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}b", *values)


def int8(code: str, scale: float, *q: int) -> CompressedTensor:
    codec = Codec("int8", block=len(q))
    return CompressedTensor(codec, code, (len(q),), np.frombuffer(f32(scale) + i8(*q), np.uint8))


def cast(name: str, code: str, *values: float) -> CompressedTensor:
    """A bf16 or fp16 payload of ``values`` (exact in that format) for a ``code`` tensor."""
    if name == "fp16":
        bits = np.array(values, "<f2").view("<u2")
    else:
        bits = (np.array(values, "<f4").view("<u4") >> 16).astype("<u2")
    return CompressedTensor(Codec(name), code, (len(values),), bits.view(np.uint8))


def topk_int8(code: str, scale: float, values: tuple[int, int], positions: tuple[int, int]):  # type: ignore[no-untyped-def]
    codec = Codec("topk", chunk=8, k=2, index=16, values="int8")
    data = f32(scale) + i8(*values) + struct.pack("<2H", *positions)
    return CompressedTensor(codec, code, (8,), np.frombuffer(data, np.uint8))


NAN_BF16 = float("nan")

BEYOND = {  # a hostile tensor, and the first element that comes back beyond its dtype
    "int8 scale at float32's largest, <f4": (int8("<f4", F32_MAX, 1, 0, 127, -5), 2),
    "topk int8 scale at float32's largest, <f4": (topk_int8("<f4", F32_MAX, (1, 127), (1, 6)), 6),
    "int8 on <f2": (int8("<f2", 1000.0, 3, 127, 0), 1),
    "bf16 on <f2": (cast("bf16", "<f2", 1.0, 2.0**40, 3.0), 1),
    "fp16 on float8_e4m3fn (NaN, no infinity)": (cast("fp16", "float8_e4m3fn", 448.0, 1e4), 1),
    "fp16 on float8_e5m2 (a tie rounds to even: 65536)": (
        cast("fp16", "float8_e5m2", 1.0, 57344.0, 61440.0),
        2,
    ),
    "int8 on bfloat16": (int8("bfloat16", F32_MAX, 127), 0),
    "a NaN beside it does not hide it": (cast("bf16", "<f2", NAN_BF16, 2.0**20), 1),
}


@pytest.mark.parametrize(("tensor", "first"), list(BEYOND.values()), ids=list(BEYOND))
def test_the_first_value_beyond_the_dtype_is_found(tensor: CompressedTensor, first: int) -> None:
    assert first_beyond_dtype(tensor) == first  # only checking (topk: its kept values)
    out = np.empty(tensor.size, tensor.dtype)
    assert first_beyond_dtype(tensor, out) == first  # as get rounds into its output
    with np.errstate(over="ignore", invalid="ignore"):
        assert not np.isfinite(out[first].astype(np.float64))


WITHIN = {  # the edges each dtype still holds: nothing to refuse
    "int8 to float32's largest": int8("<f4", F32_MAX / 127 * (1 - 2.0**-22), 127, -127),
    "float16's largest": cast("fp16", "<f2", 65504.0, -65504.0),
    "fp16 448 on float8_e4m3fn": cast("fp16", "float8_e4m3fn", 448.0, -448.0, 0.0),
    "fp16 rounding down to float8_e5m2's largest": cast("fp16", "float8_e5m2", 57344.0, 61408.0),
    "bf16 on bfloat16": cast("bf16", "bfloat16", float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)),
    "a NaN stays a NaN (non-finite is the caller's other check)": cast("bf16", "<f2", NAN_BF16),
    "topk on <f2": topk_int8("<f2", 500.0, (127, -3), (0, 7)),
}


@pytest.mark.parametrize("tensor", list(WITHIN.values()), ids=list(WITHIN))
def test_values_within_the_dtype_pass_and_are_rounded_once(tensor: CompressedTensor) -> None:
    assert first_beyond_dtype(tensor) is None
    out = np.empty(tensor.size, tensor.dtype)
    assert first_beyond_dtype(tensor, out) is None
    dt = numpy_dtype(tensor.dtype_code)
    assert dt is not None
    exact = tensor.decompress().reshape(-1)
    kept = np.isfinite(exact)
    with np.errstate(over="ignore"):
        assert np.array_equal(
            out[kept].astype(np.float64), exact[kept].astype(dt).astype(np.float64)
        )


def test_a_sparse_tensor_is_checked_past_the_first_window() -> None:
    """One topk chunk three windows in holds the overflow: it is named by its element."""
    codec = Codec("topk", chunk=4096, k=1, index=16, values="int8")
    chunks = 3 * WINDOW // 4096 + 4
    records = [f32(1.0) + i8(127) + struct.pack("<H", 9)] * chunks
    far = 3 * WINDOW // 4096 + 1
    records[far] = f32(F32_MAX) + i8(-127) + struct.pack("<H", 4000)
    payload = np.frombuffer(b"".join(records), np.uint8)
    tensor = CompressedTensor(codec, "<f4", (4096 * chunks,), payload)
    assert first_beyond_dtype(tensor) == far * 4096 + 4000
    assert first_beyond_dtype(tensor, np.empty(tensor.size, np.float32)) == far * 4096 + 4000
