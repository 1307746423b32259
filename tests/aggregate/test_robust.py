"""median and trimmed_mean: exact against np.median / a sorted stack, robust to an outlier."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import AggregationParams, aggregate, mean, median, trimmed_mean
from gradstore.aggregate._network import apply_network, batcher_pairs, selection_network

Grad = dict[str, np.ndarray[Any, Any]]

# "b" crosses the 16 Ki-element block boundary twice; "s" is 0-d, "e" is empty.
SHAPES = {"w": (40, 30), "b": (40_003,), "s": (), "e": (2, 0)}


def make_inputs(seed: int, n: int, dtype: str = "<f4") -> list[Grad]:
    rng = np.random.default_rng(seed)
    return [
        {name: rng.standard_normal(shape).astype(dtype) for name, shape in SHAPES.items()}
        for _ in range(n)
    ]


def stacked(inputs: list[Grad], name: str) -> np.ndarray[Any, Any]:
    return np.stack([x[name] for x in inputs]).astype(np.float64)


@pytest.mark.parametrize("n", range(1, 13))
def test_network_sorts_every_0_1_input(n: int) -> None:
    # 0-1 principle (Knuth 5.3.4): a comparator network that sorts all 0-1 inputs sorts all.
    network = selection_network(n, tuple(range(n)))
    assert len(network) == len(batcher_pairs(n))
    for bits in itertools.product((0, 1), repeat=n):
        assert apply_network(list(bits), network) == sorted(bits), bits


@pytest.mark.parametrize("n", [3, 4, 7, 8, 11])
def test_pruned_network_still_finds_the_middle(n: int) -> None:
    wanted = tuple(range((n - 1) // 2, n // 2 + 1))
    network = selection_network(n, wanted)
    assert len(network) <= len(batcher_pairs(n))
    for bits in itertools.product((0, 1), repeat=n):
        out = apply_network(list(bits), network)
        assert [out[i] for i in wanted] == [sorted(bits)[i] for i in wanted], bits


@pytest.mark.parametrize("seed", [101, 102])
@pytest.mark.parametrize("n", [3, 4, 7, 8])
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_median_equals_numpy_median(seed: int, n: int, dtype: str) -> None:
    inputs = make_inputs(seed, n, dtype)
    result = median(inputs)
    assert list(result) == ["b", "e", "s", "w"]
    for name in SHAPES:
        expected = np.median(stacked(inputs, name), axis=0).astype(dtype)
        assert result[name].dtype == np.dtype(dtype) and result[name].shape == SHAPES[name]
        np.testing.assert_array_equal(result[name], expected, err_msg=name)


def trimmed_reference(inputs: list[Grad], name: str, k: int) -> np.ndarray[Any, Any]:
    ordered = np.sort(stacked(inputs, name), axis=0)[k : len(inputs) - k]
    acc = ordered[0].copy()
    for row in ordered[1:]:
        acc = acc + row
    result: np.ndarray[Any, Any] = (acc / len(ordered)).astype(inputs[0][name].dtype)
    return result


@pytest.mark.parametrize("seed", [111])
@pytest.mark.parametrize(
    ("n", "ratio", "k"), [(5, 0.2, 1), (10, 0.3, 3), (9, 0.45, 4), (4, 0.0, 0)]
)
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_trimmed_mean_drops_k_per_side(seed: int, n: int, ratio: float, k: int, dtype: str) -> None:
    inputs = make_inputs(seed, n, dtype)
    result = trimmed_mean(inputs, ratio)
    for name in SHAPES:
        assert result[name].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(result[name], trimmed_reference(inputs, name, k), name)


@pytest.mark.parametrize("seed", [121])
def test_repeatable_and_independent_of_threads(seed: int) -> None:
    rng = np.random.default_rng(seed)
    inputs = [{"big": rng.standard_normal((1 << 20) + 9, dtype=np.float32)} for _ in range(4)]
    params = AggregationParams("trimmed_mean", trim_ratio=0.25)
    one, two = aggregate(inputs, params, threads=1), aggregate(inputs, params, threads=2)
    assert one["big"].tobytes() == two["big"].tobytes()
    assert median(inputs)["big"].tobytes() == median(inputs)["big"].tobytes()


def test_zero_is_written_as_positive_zero() -> None:
    inputs = [{"x": np.array([v], np.float32)} for v in (-0.0, 0.0, -0.0, 5.0)]
    out = median(inputs)["x"]
    assert out[0] == 0 and not np.signbit(out[0])


@pytest.mark.parametrize("seed", [131, 132])
def test_one_byzantine_input_cannot_drag_median_or_trimmed_mean(seed: int) -> None:
    rng = np.random.default_rng(seed)
    honest = [{"g": rng.normal(1.0, 0.1, 1000).astype(np.float32)} for _ in range(6)]
    attacker = {"g": np.full(1000, -1e6, np.float32)}
    inputs = [*honest[:3], attacker, *honest[3:]]
    low = np.min([x["g"] for x in honest], axis=0)
    high = np.max([x["g"] for x in honest], axis=0)
    for result in (median(inputs), trimmed_mean(inputs, 0.15)):
        assert np.all((low <= result["g"]) & (result["g"] <= high))
    assert np.all(mean(inputs)["g"] < -1e5)  # what the robust methods protect against


@pytest.mark.parametrize("seed", [141])
def test_clipping_applies_before_the_median(seed: int) -> None:
    inputs = make_inputs(seed, 5, "<f8")
    norms = [np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in x.values())) for x in inputs]
    bound = float(np.median(norms))
    result = aggregate(inputs, AggregationParams("median", clip_input_norm=bound))
    scales = [min(1.0, bound / n) for n in norms]
    for name in SHAPES:
        rows = np.stack([x[name] * s for x, s in zip(inputs, scales, strict=True)])
        np.testing.assert_allclose(result[name], np.median(rows, axis=0), rtol=1e-14, atol=0)


@pytest.mark.parametrize("method", ["median", "trimmed_mean"])
def test_one_element_tensors_of_many_inputs(method: str) -> None:
    """Sixteen inputs or more of a scalar: NumPy 2.4's isfinite into a strided (n, 1) mask
    left most of it unwritten, and the round was refused as NaN."""
    rng = np.random.default_rng(16)
    for n in (16, 17, 40):
        inputs = [
            {"s": np.float32(rng.standard_normal()), "v": rng.standard_normal(1)} for _ in range(n)
        ]
        extra = {"trim_ratio": 0.25} if method == "trimmed_mean" else {}
        out = aggregate(inputs, AggregationParams(method, **extra))
        k = int(n * 0.25) if method == "trimmed_mean" else (n - 1) // 2
        stop = n - k if method == "trimmed_mean" else n // 2 + 1
        for name in ("s", "v"):
            column = sorted(float(np.ravel(x[name])[0]) for x in inputs)[k:stop]
            assert float(np.ravel(out[name])[0]) == pytest.approx(sum(column) / len(column))
