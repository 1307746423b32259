"""A peer's signalling NaN (bfloat16 0x7F81, float32 0x7F800001, ...) is refused as any NaN
is, at every step its document reaches (decode, the coordinator's input check, the
aggregators, the decompressor), without NumPy printing a RuntimeWarning on the way."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import (
    METHODS,
    AggregationParams,
    InMemory,
    aggregate,
    aggregate_streamed,
    compressed_norm,
    compressed_source,
)
from gradstore.aggregate._checks import check_inputs
from gradstore.compress import compress
from gradstore.coordinator import check_gradient
from gradstore.errors import AggregationError, CompressionError
from gradstore.format import (
    Codec,
    CompressedGradient,
    CompressedTensor,
    Gradient,
    decode,
    decode_any,
    encode,
    numpy_dtype,
)

#: dtype -> a signalling NaN's bits: exponent all ones, quiet bit clear, payload 1.
SNANS = {
    "bfloat16": 0x7F81,
    "<f2": 0x7C01,
    "<f4": 0x7F800001,
    "<f8": 0x7FF0000000000001,
    "float8_e5m2": 0x7D,
}
N = 7  # inputs; input 1 holds the NaN
SIZE = 64
REFUSED = "non-finite: tensor 'w' holds NaN or Inf"
EXTRAS: dict[str, dict[str, Any]] = {
    "weighted": {"weights": (1.0,) * N},
    "trimmed_mean": {"trim_ratio": 0.2},
    "krum": {"byzantine": 1},
    "multikrum": {"byzantine": 1, "select": 2},
}


@contextmanager
def quietly() -> Iterator[None]:
    """Fail if NumPy warns inside (worker threads included); the code runs to its end."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    assert [str(w.message) for w in seen] == []


def _params(method: str, clip: float | None = None) -> AggregationParams:
    return AggregationParams(method, clip_input_norm=clip, **EXTRAS.get(method, {}))


def _dense_document(code: str) -> bytes:
    """A peer's gradstore/1 document: tensor 'w' with a signalling NaN at element 3."""
    dtype = numpy_dtype(code)
    assert dtype is not None
    bits = np.zeros(SIZE, f"<u{dtype.itemsize}")
    bits[3] = SNANS[code]
    return encode(Gradient({"w": bits.view(dtype)})).tobytes()


def _refusals(run: Callable[[AggregationParams, dict[str, Any]], Any], method: str) -> None:
    """Every way of running ``method`` refuses: plain, clipped, and (streamed) one input at a time."""
    for clip in (None, 1.0):
        for window in ({}, {"window_bytes": 1}):
            with quietly(), pytest.raises(AggregationError, match=r"NaN or infinity|not finite"):
                run(_params(method, clip), window)


@pytest.mark.parametrize("code", list(SNANS))
def test_a_dense_signalling_nan_is_decoded_and_refused_quietly(code: str) -> None:
    with quietly():
        gradient = decode(_dense_document(code))
        assert check_gradient(gradient, None, clip=True)[1] == REFUSED
        assert check_gradient(gradient, None, clip=False)[1] == REFUSED
        for spec in ("bf16", "fp16", "int8", "topk:0.5"):  # a peer re-compressing it
            with pytest.raises(CompressionError, match="'w' holds NaN or infinity"):
                compress(gradient, spec)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("code", list(SNANS))
def test_aggregating_a_dense_signalling_nan_is_refused_quietly(code: str, method: str) -> None:
    bad = decode(_dense_document(code)).tensors
    dtype = bad["w"].dtype
    inputs = [{"w": np.zeros(SIZE, dtype)} for _ in range(N)]
    inputs[1] = bad
    counts = [1] * N
    for clip in (None, 1.0):
        with quietly(), pytest.raises(AggregationError, match="input 1: tensor 'w' contains NaN"):
            aggregate(inputs, _params(method, clip), counts)
    layout = check_inputs(inputs, method)
    sources = [InMemory(t) for t in inputs]
    _refusals(
        lambda params, window: asyncio.run(
            aggregate_streamed(sources, layout, params, counts, **window)
        ),
        method,
    )


def _compressed(codec: Codec, bits: int | None) -> CompressedGradient:
    """Tensor 'w' (float32, 64 elements) under ``codec``: zeros, or a signalling NaN at 3."""
    if codec.name == "topk":  # records of (bfloat16 value, 12-bit position 0) per 4 elements
        record = [0, 0, 0, 0] if bits is None else [bits & 0xFF, bits >> 8, 0, 0]
        payload = np.array(record * (SIZE // 4), np.uint8)
    else:
        values = np.zeros(SIZE, "<u2")
        values[3] = bits or 0
        payload = values.view(np.uint8)
    return CompressedGradient(codec, {"w": CompressedTensor(codec, "<f4", (SIZE,), payload)})


CODECS = {
    "bf16": (Codec("bf16"), 0x7F81),
    "fp16": (Codec("fp16"), 0x7C01),
    "topk": (Codec("topk", chunk=4, k=1, index=12, values="bf16"), 0x7F81),
}


@pytest.mark.parametrize("name", list(CODECS))
def test_a_compressed_signalling_nan_is_decoded_and_refused_quietly(name: str) -> None:
    codec, bits = CODECS[name]
    with quietly():
        gradient = decode_any(encode(_compressed(codec, bits)).tobytes())
        assert isinstance(gradient, CompressedGradient)
        assert check_gradient(gradient, None, clip=True)[1] == REFUSED
        tensor = gradient.tensors["w"]
        assert not tensor.is_finite()
        assert np.isnan(tensor.decompress()).sum() == (16 if name == "topk" else 1)
        assert np.isnan(compressed_norm(gradient))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(CODECS))
def test_aggregating_a_compressed_signalling_nan_is_refused_quietly(name: str, method: str) -> None:
    codec, bits = CODECS[name]
    inputs = [_compressed(codec, None) for _ in range(N)]
    inputs[1] = _compressed(codec, bits)
    layout = check_inputs([{"w": np.zeros(SIZE, np.float32)}], method)
    sources = [compressed_source(g) for g in inputs]
    _refusals(
        lambda params, window: asyncio.run(
            aggregate_streamed(sources, layout, params, [1] * N, **window)
        ),
        method,
    )
