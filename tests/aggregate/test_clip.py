"""Global norms and clipping: bounds respected, small inputs untouched, folded into aggregation."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import (
    AggregationParams,
    aggregate,
    aggregate_with_info,
    clip_inputs,
    clip_output,
    global_norm,
)

Grad = dict[str, np.ndarray[Any, Any]]


def make_inputs(seed: int, n: int, dtype: str = "<f4") -> list[Grad]:
    rng = np.random.default_rng(seed)
    return [
        {
            "w": (rng.standard_normal((64, 33)) * rng.uniform(0.1, 3)).astype(dtype),
            "b": (rng.standard_normal(70_000) * rng.uniform(0.001, 0.03)).astype(dtype),
        }
        for _ in range(n)
    ]


def norm64(tensors: Grad) -> float:
    flat = np.concatenate([v.astype(np.float64).ravel() for v in tensors.values()])
    return float(np.linalg.norm(flat))


@pytest.mark.parametrize("seed", [301])
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_global_norm_is_the_l2_norm_over_all_tensors(seed: int, dtype: str) -> None:
    for tensors in make_inputs(seed, 3, dtype):
        assert global_norm(tensors) == pytest.approx(norm64(tensors), rel=1e-13)


@pytest.mark.parametrize("seed", [311])
def test_clip_inputs_bounds_each_input_and_leaves_small_ones(seed: int) -> None:
    inputs = make_inputs(seed, 5, "<f8")
    bound = float(np.median([norm64(x) for x in inputs])) * (1 + 1e-9)  # no input on the edge
    clipped = clip_inputs(inputs, bound)
    for before, after in zip(inputs, clipped, strict=True):
        if norm64(before) <= bound:
            assert all(after[k] is before[k] for k in before)
        else:
            assert norm64(after) == pytest.approx(bound, rel=1e-12)
            ratio = after["w"] / before["w"]
            np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-12)  # direction kept


@pytest.mark.parametrize("seed", [321])
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_clip_output_bounds_the_result(seed: int, dtype: str) -> None:
    tensors = make_inputs(seed, 1, dtype)[0]
    bound = norm64(tensors) / 3
    out = clip_output(tensors, bound)
    assert all(out[k].dtype == np.dtype(dtype) for k in out)
    eps = float(np.finfo(np.dtype(dtype)).eps)
    assert norm64(out) <= bound * (1 + 4 * eps)
    assert norm64(out) >= bound * (1 - 4 * eps)
    assert clip_output(tensors, norm64(tensors) * 2)["w"] is tensors["w"]


@pytest.mark.parametrize("seed", [331])
def test_mean_with_input_clipping_equals_mean_of_clipped(seed: int) -> None:
    inputs = make_inputs(seed, 4, "<f8")
    bound = float(np.median([norm64(x) for x in inputs]))
    result, info = aggregate_with_info(inputs, AggregationParams("mean", clip_input_norm=bound))
    assert info.input_norms is not None and info.input_scales is not None
    np.testing.assert_allclose(info.input_norms, [norm64(x) for x in inputs], rtol=1e-13)
    assert min(info.input_scales) < 1.0 and max(info.input_scales) == 1.0
    for name in ("w", "b"):
        expected = np.mean(
            [x[name] * s for x, s in zip(inputs, info.input_scales, strict=True)], axis=0
        )
        np.testing.assert_allclose(result[name], expected, rtol=1e-13, atol=1e-16)
    # the clipped inputs' norms are within the bound, so the mean's is too (triangle inequality)
    assert norm64(result) <= bound * (1 + 1e-12)


@pytest.mark.parametrize("seed", [341])
@pytest.mark.parametrize("method", ["sum", "median", "krum"])
@pytest.mark.parametrize("rule", ["float64", "rounded"])
def test_output_clipping_for_every_method(seed: int, method: str, rule: str) -> None:
    inputs = make_inputs(seed, 5)
    extra: dict[str, Any] = {"byzantine": 1} if method == "krum" else {}
    plain = aggregate(inputs, AggregationParams(method, **extra))
    # the float64 aggregate: the same operations over the inputs widened, without the rounding
    wide = aggregate(
        [{k: v.astype(np.float64) for k, v in x.items()} for x in inputs],
        AggregationParams(method, **extra),
    )
    bound = norm64(plain) / 2
    clipped, info = aggregate_with_info(
        inputs, AggregationParams(method, clip_output_norm=bound, output_clip=rule, **extra)
    )
    assert info.output_norm is not None and info.output_scale is not None
    # round/4 ("float64"): the norm of the float64 aggregate, the scaled values rounded once;
    # round/2 and round/3 ("rounded"): the rounded aggregate's norm, scaled and rounded again
    before = wide if rule == "float64" else plain
    assert info.output_norm == global_norm(before)
    assert info.output_scale == bound / info.output_norm
    for name, values in before.items():
        want = (values.astype(np.float64) * info.output_scale).astype(np.float32)
        np.testing.assert_array_equal(clipped[name], want)
    assert norm64(clipped) <= bound * (1 + 4 * float(np.finfo(np.float32).eps))


def test_round_4_output_clipping_rounds_once() -> None:
    """Round/4 scales the float64 mean and rounds once; rounding the mean first (the rule of
    round/2 and round/3) gives other float32 bits for these inputs."""
    rng = np.random.default_rng(0)
    inputs = [{"w": v} for v in rng.standard_normal((3, 4)).astype(np.float32)]
    once = aggregate(inputs, AggregationParams("mean", clip_output_norm=0.5))["w"]
    twice = aggregate(
        inputs, AggregationParams("mean", clip_output_norm=0.5, output_clip="rounded")
    )["w"]
    mean64 = (inputs[0]["w"].astype(np.float64) + inputs[1]["w"] + inputs[2]["w"]) / 3
    norm = math.sqrt(sum(float(v) ** 2 for v in mean64))  # sequential, in element order
    np.testing.assert_array_equal(once, (mean64 * (0.5 / norm)).astype(np.float32))
    rounded = mean64.astype(np.float32).astype(np.float64)
    norm = math.sqrt(sum(float(v) ** 2 for v in rounded))
    np.testing.assert_array_equal(twice, (rounded * (0.5 / norm)).astype(np.float32))
    assert (once != twice).any()


def test_round_4_norms_sum_their_squares_one_at_a_time_in_order() -> None:
    """The rule docs/spec.md states (6.2): total = total + float64(x)**2, tensor-name order, then
    element order, across block boundaries; NumPy's pairwise sum gives other bits here."""
    rng = np.random.default_rng(3)
    a = (rng.standard_normal(70_001) * np.exp(rng.uniform(-20, 20, 70_001))).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    total = 0.0
    for x in np.concatenate([a, b]).tolist():  # "a" sorts before "b"
        total = total + x * x
    assert global_norm({"b": b, "a": a}) == math.sqrt(total)
    assert global_norm({"b": b, "a": a}, "blocked-pairwise") != math.sqrt(total)


def test_older_records_norms_sum_each_block_pairwise() -> None:
    rng = np.random.default_rng(4)
    a = (rng.standard_normal(140_000) * np.exp(rng.uniform(-20, 20, 140_000))).astype(np.float32)
    total = 0.0
    for lo in range(0, a.size, 1 << 16):
        total += float(np.square(a[lo : lo + (1 << 16)], dtype=np.float64).sum())
    assert global_norm({"a": a}, "blocked-pairwise") == math.sqrt(total)


def test_round_4_order_statistics_write_no_negative_zero_after_output_clipping() -> None:
    """A median of -2^-149 (float32's smallest) scaled by the clip rounds to zero: round/4
    writes +0.0 there, as median always does; round/2 and round/3 kept the -0.0."""
    tiny = -(2.0**-149)
    inputs = [{"w": np.array([tiny, 1000.0 + i], np.float32)} for i in range(3)]
    params = {"clip_output_norm": 1.0}
    once = aggregate(inputs, AggregationParams("median", **params))["w"]
    assert once[0] == 0 and not np.signbit(once[0])
    legacy = aggregate(inputs, AggregationParams("median", output_clip="rounded", **params))["w"]
    assert legacy[0] == 0 and np.signbit(legacy[0])
    # linear methods keep IEEE's sign: the mean of -2^-149 scaled is -0.0
    mean = aggregate(inputs, AggregationParams("mean", **params))["w"]
    assert mean[0] == 0 and np.signbit(mean[0])
