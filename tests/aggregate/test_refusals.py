"""Every input the aggregators refuse, with AggregationError and a message that says why."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import (
    METHODS,
    AggregationParams,
    aggregate,
    clip_inputs,
    clip_output,
    fedavg,
    sum_,
)
from gradstore.errors import AggregationError

Grad = dict[str, np.ndarray[Any, Any]]

SEED = 401


def make_inputs(n: int, dtype: str = "<f4", seed: int = SEED) -> list[Grad]:
    rng = np.random.default_rng(seed)
    return [
        {"w": rng.standard_normal((4, 3)).astype(dtype), "b": rng.standard_normal(5).astype(dtype)}
        for _ in range(n)
    ]


def params_for(method: str) -> AggregationParams:
    extras: dict[str, dict[str, Any]] = {
        "weighted": {"weights": (1.0,) * 5},
        "trimmed_mean": {"trim_ratio": 0.2},
        "krum": {"byzantine": 1},
        "multikrum": {"byzantine": 1},
    }
    return AggregationParams(method, **extras.get(method, {}))


def run(method: str, inputs: list[Grad], **kwargs: Any) -> None:
    counts = [1] * len(inputs) if method == "fedavg" else None
    aggregate(inputs, params_for(method), counts, **kwargs)


@pytest.mark.parametrize("method", METHODS)
def test_no_inputs(method: str) -> None:
    with pytest.raises(AggregationError, match="no inputs"):
        aggregate([], params_for(method), [])


@pytest.mark.parametrize("method", METHODS)
def test_mismatched_names(method: str) -> None:
    inputs = make_inputs(5)
    inputs[3] = {"w": inputs[3]["w"], "c": inputs[3]["b"]}
    with pytest.raises(AggregationError, match=r"input 3: tensor names differ .*\['b'\].*\['c'\]"):
        run(method, inputs)


@pytest.mark.parametrize("method", METHODS)
def test_mismatched_shapes(method: str) -> None:
    inputs = make_inputs(5)
    inputs[2]["w"] = inputs[2]["w"].reshape(3, 4)
    with pytest.raises(AggregationError, match=r"input 2: tensor 'w' has shape \(3, 4\)"):
        run(method, inputs)


@pytest.mark.parametrize("method", METHODS)
def test_mismatched_dtypes(method: str) -> None:
    inputs = make_inputs(5)
    inputs[4]["b"] = inputs[4]["b"].astype(np.float64)
    with pytest.raises(
        AggregationError, match="input 4: tensor 'b' has dtype <f8, input 0 has <f4"
    ):
        run(method, inputs)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", ["<i4", "|u1", "|b1", "<i8"])
def test_non_float_tensors(method: str, dtype: str) -> None:
    inputs = [{"steps": np.arange(3).astype(dtype)} for _ in range(5)]
    with pytest.raises(AggregationError, match="floating-point tensors only"):
        run(method, inputs)


def test_not_an_array() -> None:
    with pytest.raises(AggregationError, match="input 1: tensor 'w' is a list"):
        sum_([{"w": np.zeros(2)}, {"w": [0.0, 0.0]}])  # type: ignore[dict-item]


@pytest.mark.usefixtures("linear_kernel")  # both sum/mean/fedavg/weighted kernels
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("index", [0, 3])
def test_nan_or_inf_names_input_and_tensor(method: str, bad: float, index: int) -> None:
    inputs = make_inputs(5)
    inputs[index]["b"][2] = bad
    with pytest.raises(
        AggregationError, match=f"input {index}: tensor 'b' contains NaN or infinity"
    ):
        run(method, inputs)


@pytest.mark.usefixtures("linear_kernel")  # both sum/mean/fedavg/weighted kernels
@pytest.mark.parametrize("method", ["mean", "median", "krum"])
def test_nan_refused_also_with_input_clipping(method: str) -> None:
    inputs = make_inputs(5)
    inputs[1]["w"][0, 0] = np.nan
    extra: dict[str, Any] = {"byzantine": 1} if method == "krum" else {}
    with pytest.raises(AggregationError, match="input 1: tensor 'w' contains NaN"):
        aggregate(inputs, AggregationParams(method, clip_input_norm=1.0, **extra))


@pytest.mark.usefixtures("linear_kernel")  # both sum/mean/fedavg/weighted kernels
def test_nan_with_zero_weight_is_still_refused() -> None:
    inputs = make_inputs(2)
    inputs[1]["w"][1, 1] = np.nan
    with pytest.raises(AggregationError, match="input 1: tensor 'w' contains NaN"):
        aggregate(inputs, AggregationParams("weighted", weights=(1.0, 0.0)))


@pytest.mark.usefixtures("linear_kernel")  # both sum/mean/fedavg/weighted kernels
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_an_aggregate_that_overflows_its_dtype(dtype: str) -> None:
    big = float(np.finfo(np.dtype(dtype)).max)
    inputs = [{"x": np.array([big], dtype)}, {"x": np.array([big], dtype)}]
    with pytest.raises(AggregationError, match="sum: aggregating tensor 'x' overflows"):
        sum_(inputs)


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (None, "num_samples are required"),
        ([1, 2], "2 num_samples for 3 inputs"),
        ([1, 0, 2], r"num_samples\[1\] must be > 0"),
        ([1, 2, -3], r"num_samples\[2\] must be > 0"),
        ([1, 2.5, 3], r"num_samples\[1\] must be an integer"),
        ([True, 1, 1], r"num_samples\[0\] must be an integer"),
    ],
)
def test_fedavg_sample_counts(counts: list[Any] | None, message: str) -> None:
    with pytest.raises(AggregationError, match=message):
        fedavg(make_inputs(3), counts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("params", "n", "message"),
    [
        (AggregationParams("weighted", weights=(1.0, 2.0)), 3, "2 weights for 3 inputs"),
        (AggregationParams("weighted", weights=(0.0, 0.0, 0.0)), 3, "all weights are zero"),
        (AggregationParams("median"), 2, "cannot outvote anyone"),
        (AggregationParams("median"), 1, "cannot outvote anyone"),
        (AggregationParams("trimmed_mean", trim_ratio=0.2), 4, "trims nothing"),
        (AggregationParams("krum", byzantine=1), 4, "Krum needs n >= 2f \\+ 3"),
        (AggregationParams("krum", byzantine=0), 2, "Krum needs n >= 2f \\+ 3"),
        (AggregationParams("multikrum", byzantine=1, select=5), 5, "more than n - f"),
    ],
)
def test_too_few_inputs_for_the_parameters(params: AggregationParams, n: int, message: str) -> None:
    # never "aggregate" by handing back one peer's data
    with pytest.raises(AggregationError, match=message):
        aggregate(make_inputs(n), params)


@pytest.mark.parametrize("bound", [0.0, -1.0, float("nan")])
def test_clip_helpers_refuse_bad_bounds(bound: float) -> None:
    with pytest.raises(AggregationError, match="clipping norm"):
        clip_output(make_inputs(1)[0], bound)
    with pytest.raises(AggregationError, match="clipping norm"):
        clip_inputs(make_inputs(2), bound)


def test_clip_helpers_refuse_nan_and_ints() -> None:
    inputs = make_inputs(2)
    inputs[1]["b"][0] = np.inf
    with pytest.raises(AggregationError, match="input 1: tensor 'b' contains NaN or infinity"):
        clip_inputs(inputs, 1.0)
    with pytest.raises(AggregationError, match="only floating-point tensors are clipped"):
        clip_output({"n": np.arange(3)}, 1.0)
