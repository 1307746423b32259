"""Aggregating compressed inputs: decompress to float64, then the method; the same bits by
every path (sparse accumulation, windows, one input at a time), -0.0 included."""

from __future__ import annotations

import asyncio
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from gradstore.aggregate import (
    AggregationParams,
    InMemory,
    Layout,
    SparseSource,
    aggregate_streamed,
    compressed_norm,
    compressed_source,
    global_norm,
)
from gradstore.aggregate._blocks import CHUNK
from gradstore.compress import compress
from gradstore.format import CompressedGradient, Gradient

SEED = 20270111
SPECS = [
    None,
    "topk:0.02,values=int8",
    "int8",
    "topk:0.05,values=2bit",
    "bf16",
    "topk:0.01",
    "fp16",
]
METHODS: list[dict[str, Any]] = [
    {"method": "sum"},
    {"method": "mean"},
    {"method": "fedavg"},
    {"method": "weighted", "weights": (1.0, 2.0, 0.5, 3.0, 1.5, 0.0, 2.5)},
    {"method": "median"},
    {"method": "trimmed_mean", "trim_ratio": 0.2},
    {"method": "krum", "byzantine": 1},
    {"method": "multikrum", "byzantine": 1, "select": 3},
    {"method": "mean", "clip_input_norm": 50.0, "clip_output_norm": 10.0},
    {"method": "fedavg", "clip_input_norm": 60.0},
]
SAMPLES = [3, 1, 4, 1, 5, 9, 2]


def _dense(dtype: Any = "<f4") -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(SEED)
    shapes = {"big": (CHUNK + 12_345,), "a": (3, 70), "z": ()}
    return [
        {k: (rng.standard_normal(s) * (1 + i)).astype(dtype) for k, s in shapes.items()}
        for i in range(len(SPECS))
    ]


def _inputs(dense: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray] | CompressedGradient]:
    return [
        t if spec is None else compress(Gradient(t), spec)
        for t, spec in zip(dense, SPECS, strict=True)
    ]


def _source(x: dict[str, np.ndarray] | CompressedGradient) -> Any:
    return compressed_source(x) if isinstance(x, CompressedGradient) else InMemory(x)


def _decompressed(x: dict[str, np.ndarray] | CompressedGradient) -> dict[str, np.ndarray]:
    if isinstance(x, CompressedGradient):
        return {n: t.decompress() for n, t in x.tensors.items()}
    return {n: np.asarray(a) for n, a in x.items()}


def _run(sources: list[Any], layout: Layout, params: AggregationParams, **kw: Any) -> Any:
    return asyncio.run(aggregate_streamed(sources, layout, params, SAMPLES[: len(sources)], **kw))


def _layout(dense: dict[str, np.ndarray]) -> Layout:
    return Layout.of((n, a.dtype, a.shape) for n, a in dense.items())


@pytest.mark.parametrize("kw", METHODS, ids=lambda kw: "-".join(map(str, kw.values())))
@pytest.mark.parametrize("window_bytes", [1 << 30, 5 << 20, 1 << 16])
def test_compressed_inputs_give_the_bits_of_their_decompressed_values(
    kw: dict[str, Any], window_bytes: int
) -> None:
    dense = _dense()
    inputs = _inputs(dense)
    layout = _layout(dense[0])
    params = AggregationParams(**kw)
    # the definition: every input decompressed to float64 (dense), then the method, the
    # aggregate in the inputs' dtype; read through plain in-memory sources (windowed path)
    want, want_info = _run([InMemory(_decompressed(x)) for x in inputs], layout, params)
    got, info = _run([_source(x) for x in inputs], layout, params, window_bytes=window_bytes)
    assert info == want_info
    for name in want:
        assert got[name].dtype == np.float32 and got[name].shape == dense[0][name].shape
        assert got[name].tobytes() == want[name].tobytes(), (kw, window_bytes, name)


@pytest.mark.parametrize("method", ["sum", "mean", "fedavg", "weighted"])
def test_linear_methods_follow_the_formula_element_by_element(method: str) -> None:
    dense = _dense()
    inputs = _inputs(dense)
    weights = (1.0, 2.0, 0.5, 3.0, 1.5, 0.0, 2.5)
    params = AggregationParams(method=method, weights=weights if method == "weighted" else None)
    got, _ = _run([_source(x) for x in inputs], _layout(dense[0]), params)
    values = [_decompressed(x) for x in inputs]
    coefs: list[float] | None = None
    divisor: float | None = None
    if method == "mean":
        divisor = float(len(values))
    elif method == "fedavg":
        coefs, divisor = [float(s) for s in SAMPLES], float(sum(SAMPLES))
    elif method == "weighted":
        coefs, divisor = list(weights), float(sum(weights))
    for name in got:
        acc = values[0][name].astype(np.float64) * (1.0 if coefs is None else coefs[0])
        if coefs is None:
            acc = values[0][name].astype(np.float64).copy()
        for i in range(1, len(values)):
            term = values[i][name].astype(np.float64)
            acc = acc + (term if coefs is None else term * coefs[i])
        if divisor is not None:
            acc = acc / divisor
        assert got[name].tobytes() == acc.astype(np.float32).tobytes(), name


def test_minus_zero_survives_exactly_as_in_the_dense_definition() -> None:
    n = 5000
    first = np.zeros(n, np.float32)
    first[::2] = -0.0  # the accumulator starts with -0.0 at even positions
    sparse = np.zeros(n, np.float32)
    sparse[::7] = np.arange(len(sparse[::7])) + 1.0
    inputs: list[Any] = [
        {"x": first},
        compress({"x": sparse}, "topk:0.2"),
        {"x": -np.zeros(n, np.float32)},
    ]
    for params in (AggregationParams(method="sum"), AggregationParams(method="mean")):
        got, _ = _run([_source(x) for x in inputs], Layout.of([("x", np.float32, (n,))]), params)
        want, _ = _run(
            [InMemory(_decompressed(x)) for x in inputs],
            Layout.of([("x", np.float32, (n,))]),
            params,
        )
        assert got["x"].tobytes() == want["x"].tobytes()
        # -0.0 + (+0.0) is +0.0: the sparse input's untouched zeros turned every -0.0 positive
        assert not np.signbit(got["x"][got["x"] == 0]).any()
    # a weight of 0 times a negative kept value is -0.0; with a -0.0 input after it, it stays
    neg = compress({"x": -np.ones(n, np.float32)}, "topk:1.0")
    inputs = [neg, {"x": -np.zeros(n, np.float32)}]
    params = AggregationParams(method="weighted", weights=(0.0, 1.0))
    layout = Layout.of([("x", np.float32, (n,))])
    got, _ = _run([_source(x) for x in inputs], layout, params)
    want, _ = _run([InMemory(_decompressed(x)) for x in inputs], layout, params)
    assert got["x"].tobytes() == want["x"].tobytes()
    assert np.signbit(got["x"]).all()


class _Counting:
    """A sparse source that counts dense reads."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.codec = source.codec
        self.dense_reads = 0

    async def read(self, name: str, start: int, stop: int) -> np.ndarray:
        self.dense_reads += 1
        return await self.source.read(name, start, stop)

    async def read_sparse(self, name: str, start: int, stop: int) -> Any:
        return await self.source.read_sparse(name, start, stop)


def test_sparse_inputs_are_added_without_being_densified() -> None:
    dense = _dense()
    counted = [_Counting(compressed_source(compress(Gradient(t), "topk:0.01"))) for t in dense]
    assert all(isinstance(c, SparseSource) for c in counted)
    params = AggregationParams(method="fedavg")
    _run(counted, _layout(dense[0]), params)
    assert [c.dense_reads for c in counted] == [0] * len(counted)


def test_compressed_norms_are_the_norms_of_the_decompressed_values() -> None:
    for x in _inputs(_dense()):
        if isinstance(x, CompressedGradient):
            assert compressed_norm(x) == global_norm(_decompressed(x))


def test_bfloat16_tensors_compressed_aggregate_to_bfloat16() -> None:
    dense = _dense(ml_dtypes.bfloat16)
    inputs = [compress(Gradient(t), "topk:0.05,values=int8") for t in dense[:3]] + dense[3:4]
    layout = _layout(dense[0])
    params = AggregationParams(method="mean")
    got, _ = _run([_source(x) for x in inputs], layout, params)
    want, _ = _run([InMemory(_decompressed(x)) for x in inputs], layout, params)
    for name in got:
        assert got[name].dtype == dense[0][name].dtype
        assert got[name].tobytes() == want[name].tobytes()


def test_median_sorts_the_decompressed_values_not_a_rounded_copy() -> None:
    # int8 values (scale * q) are rarely float32 numbers: with an even count the median is
    # the mean of the two middle values, which a rounded copy would change
    dense = _dense()[:6]
    inputs = [compress(Gradient(t), "int8:64") for t in dense]
    params = AggregationParams(method="median")
    got, _ = _run([_source(x) for x in inputs], _layout(dense[0]), params)
    for name in got:
        stacked = np.stack([_decompressed(x)[name] for x in inputs])
        want = (np.median(stacked, axis=0).astype(np.float32) + np.float32(0)).astype(np.float32)
        assert got[name].tobytes() == want.tobytes(), name
