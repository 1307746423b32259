"""sum, mean, fedavg, weighted: exact against the float64 loop they promise, reproducible.

Every test runs once on the NumPy kernel and once on the numba kernel (``linear_kernel``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import (
    AggregationParams,
    aggregate,
    aggregate_with_info,
    fedavg,
    mean,
    sum_,
    weighted,
)

pytestmark = pytest.mark.usefixtures("linear_kernel")

Grad = dict[str, np.ndarray[Any, Any]]

# Sizes cross the kernels' 64 Ki-element block boundary; "s" is a 0-d tensor, "e" is empty.
SHAPES = {"w": (300, 250), "b": (70_001,), "s": (), "e": (0, 4)}


def make_inputs(seed: int, n: int, dtype: str = "<f4") -> list[Grad]:
    rng = np.random.default_rng(seed)
    return [
        {name: rng.standard_normal(shape).astype(dtype) for name, shape in SHAPES.items()}
        for _ in range(n)
    ]


def reference(inputs: list[Grad], coefs: list[float] | None, divisor: float | None) -> Grad:
    """The documented order of operations, written the obvious way."""
    out = {}
    for name in inputs[0]:
        terms = [x[name].astype(np.float64) for x in inputs]
        if coefs is not None:
            terms = [t * c for t, c in zip(terms, coefs, strict=True)]
        acc = terms[0].copy()
        for t in terms[1:]:
            acc = acc + t
        if divisor is not None:
            acc = acc / divisor
        out[name] = acc.astype(inputs[0][name].dtype)
    return out


def assert_same(a: Grad, b: Grad) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name, strict=True)


@pytest.mark.parametrize("seed", [11, 12])
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_sum_and_mean_match_the_float64_loop(seed: int, dtype: str) -> None:
    inputs = make_inputs(seed, 5, dtype)
    assert list(sum_(inputs)) == ["b", "e", "s", "w"]  # name order, as the document sorts them
    assert_same(sum_(inputs), reference(inputs, None, None))
    assert_same(mean(inputs), reference(inputs, None, 5.0))
    _, info = aggregate_with_info(inputs, AggregationParams("sum"))
    assert info.weights == (1.0,) * 5
    _, info = aggregate_with_info(inputs, AggregationParams("mean"))
    assert info.weights == (0.2,) * 5


@pytest.mark.parametrize("seed", [21])
def test_fedavg_weights_by_num_samples(seed: int) -> None:
    inputs = make_inputs(seed, 4)
    counts = [10, 30, 5, 55]
    result, info = aggregate_with_info(inputs, AggregationParams("fedavg"), counts)
    assert_same(result, reference(inputs, [10.0, 30.0, 5.0, 55.0], 100.0))
    assert info.weights == (0.1, 0.3, 0.05, 0.55)
    # and it is the weighted average NumPy users know, to float32 rounding
    stacked = np.stack([x["w"] for x in inputs]).astype(np.float64)
    expected = np.average(stacked, axis=0, weights=counts)
    np.testing.assert_allclose(result["w"], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("seed", [31])
def test_weighted_normalises_the_weights(seed: int) -> None:
    inputs = make_inputs(seed, 3)
    weights = [0.5, 0.0, 2.0]
    result = weighted(inputs, weights)
    assert_same(result, reference(inputs, weights, 2.5))
    # a zero weight means the input has no influence at all
    changed = [inputs[0], {k: v + 100 for k, v in inputs[1].items()}, inputs[2]]
    assert_same(weighted(changed, weights), result)


@pytest.mark.parametrize("seed", [41])
def test_fedavg_with_equal_counts_is_close_to_mean(seed: int) -> None:
    inputs = make_inputs(seed, 3)
    np.testing.assert_allclose(fedavg(inputs, [7, 7, 7])["w"], mean(inputs)["w"], rtol=1e-6)


@pytest.mark.parametrize("seed", [51])
def test_bit_for_bit_repeatable_and_independent_of_threads(seed: int) -> None:
    # 1 Mi + 3 elements: two work chunks, so two threads really split the tensor.
    rng = np.random.default_rng(seed)
    inputs = [{"big": rng.standard_normal((1 << 20) + 3, dtype=np.float32)} for _ in range(3)]
    params = AggregationParams("weighted", weights=(0.2, 0.3, 0.5))
    one = aggregate(inputs, params, threads=1)
    two = aggregate(inputs, params, threads=2)
    again = aggregate(inputs, params, threads=2)
    assert one["big"].tobytes() == two["big"].tobytes() == again["big"].tobytes()
    assert_same(one, reference(inputs, [0.2, 0.3, 0.5], 1.0))


def test_input_order_is_part_of_the_result() -> None:
    # float64 addition is not associative: the order the coordinator fixes matters.
    a = {"x": np.array([1e16], np.float64)}
    b = {"x": np.array([1.0], np.float64)}
    c = {"x": np.array([-1e16], np.float64)}
    assert sum_([a, b, c])["x"][0] == 0.0
    assert sum_([a, c, b])["x"][0] == 1.0


def test_float16_accumulates_in_float64() -> None:
    # 4096 + 1 + 1 + ... is 4096 in float16 arithmetic; the float64 accumulator keeps every 1.
    inputs = [{"x": np.array([4096.0], np.float16)}] + [{"x": np.array([1.0], np.float16)}] * 8
    assert sum_(inputs)["x"][0] == np.float16(4104.0)


def test_inputs_are_not_modified() -> None:
    inputs = make_inputs(61, 3)
    before = [{k: v.copy() for k, v in x.items()} for x in inputs]
    aggregate(inputs, AggregationParams("mean", clip_input_norm=1.0, clip_output_norm=0.5))
    for x, y in zip(inputs, before, strict=True):
        assert_same(x, y)
