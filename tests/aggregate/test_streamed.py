"""Streamed aggregation gives the in-memory bits, for every method, window size and path."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import (
    AggregationParams,
    InMemory,
    Layout,
    aggregate_streamed,
    aggregate_with_info,
    global_norm,
)
from gradstore.aggregate._blocks import CHUNK
from gradstore.errors import AggregationError

SEED = 20261201

METHODS: list[dict[str, Any]] = [
    {"method": "sum"},
    {"method": "mean"},
    {"method": "fedavg"},
    {"method": "weighted", "weights": (1.0, 2.0, 0.5, 3.0, 1.5)},
    {"method": "median"},
    {"method": "trimmed_mean", "trim_ratio": 0.2},
    {"method": "krum", "byzantine": 1},
    {"method": "multikrum", "byzantine": 1, "select": 3},
    {"method": "mean", "clip_input_norm": 50.0, "clip_output_norm": 10.0},
    {"method": "median", "clip_input_norm": 50.0},
    {"method": "multikrum", "byzantine": 1, "clip_input_norm": 60.0},
    {"method": "fedavg", "accumulate": "exact"},
    {"method": "mean", "accumulate": "exact", "clip_input_norm": 50.0, "clip_output_norm": 10.0},
]


def _inputs(n: int = 5, dtype: str = "<f4") -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(SEED)
    # "big" spans two chunks (and many windows); "a" and "z" are small; names sort by bytes
    shapes = {"big": (CHUNK + 12_345,), "a": (3, 7), "z": ()}
    return [
        {k: (rng.standard_normal(s) * (1 + i)).astype(dtype) for k, s in shapes.items()}
        for i in range(n)
    ]


def _layout(tensors: dict[str, np.ndarray]) -> Layout:
    return Layout.of((name, a.dtype, a.shape) for name, a in tensors.items())


@pytest.mark.parametrize("kw", METHODS, ids=lambda kw: "-".join(map(str, kw.values())))
@pytest.mark.parametrize("window_bytes", [1 << 30, 5 << 20, 1 << 16])
def test_streamed_equals_in_memory_bit_for_bit(kw: dict[str, Any], window_bytes: int) -> None:
    # 1 GiB: one window per tensor; 5 MiB: many windows; 64 KiB: the one-input-at-a-time path
    inputs = _inputs()
    params = AggregationParams(**kw)
    samples = [3, 1, 4, 1, 5]
    want, want_info = aggregate_with_info(inputs, params, samples)
    norms = [global_norm(t) for t in inputs] if params.clip_input_norm else None
    for given in (norms, None):  # norms from verification, or taken in a first pass
        got, info = asyncio.run(
            aggregate_streamed(
                [InMemory(t) for t in inputs],
                _layout(inputs[0]),
                params,
                samples,
                norms=given,
                window_bytes=window_bytes,
            )
        )
        assert list(got) == list(want)
        for name in want:
            assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
            assert got[name].tobytes() == want[name].tobytes(), (kw, window_bytes, name, SEED)
        assert info == want_info


def test_float64_inputs_too() -> None:
    inputs = _inputs(4, "<f8")
    params = AggregationParams("fedavg")
    want, _ = aggregate_with_info(inputs, params, [1, 2, 3, 4])
    got, _ = asyncio.run(
        aggregate_streamed(
            [InMemory(t) for t in inputs], _layout(inputs[0]), params, [1, 2, 3, 4],
            window_bytes=1 << 16,
        )
    )  # fmt: skip
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)


def test_refusals_are_the_aggregators() -> None:
    inputs = _inputs(2)
    with pytest.raises(AggregationError, match="median"):
        asyncio.run(
            aggregate_streamed(
                [InMemory(t) for t in inputs], _layout(inputs[0]), AggregationParams("median")
            )
        )
    inputs[1]["big"][77] = np.inf
    with pytest.raises(AggregationError, match="NaN or infinity"):
        asyncio.run(
            aggregate_streamed(
                [InMemory(t) for t in inputs], _layout(inputs[0]), AggregationParams("sum")
            )
        )
