"""krum and multikrum: same scores and selection as the textbook pairwise computation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import AggregationParams, aggregate_with_info, krum, mean, multikrum

Grad = dict[str, np.ndarray[Any, Any]]

SHAPES = {"w": (50, 20), "b": (70_000,), "s": ()}  # "b" spans three 32 Ki-element blocks


def make_inputs(seed: int, n: int, dtype: str = "<f4") -> list[Grad]:
    rng = np.random.default_rng(seed)
    centre = {name: rng.standard_normal(shape) for name, shape in SHAPES.items()}
    return [
        {
            name: (c + rng.normal(0, rng.uniform(0.1, 2.0), c.shape)).astype(dtype)
            for name, c in centre.items()
        }
        for _ in range(n)
    ]


def reference_scores(inputs: list[Grad], f: int) -> list[float]:
    """Blanchard et al.: score(i) = sum of the n - f - 2 smallest |x_i - x_j|^2, j != i."""
    vectors = [np.concatenate([x[k].astype(np.float64).ravel() for k in sorted(x)]) for x in inputs]
    n = len(vectors)
    scores = []
    for i in range(n):
        dists = sorted(float(np.sum((vectors[i] - vectors[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(dists[: n - f - 2]))
    return scores


@pytest.mark.parametrize("seed", [201, 202, 203])
@pytest.mark.parametrize(("n", "f"), [(5, 1), (7, 2), (9, 3)])
def test_krum_selects_the_reference_choice(seed: int, n: int, f: int) -> None:
    inputs = make_inputs(seed, n)
    result, info = aggregate_with_info(inputs, AggregationParams("krum", byzantine=f))
    expected = reference_scores(inputs, f)
    assert info.scores is not None and info.selected is not None
    np.testing.assert_allclose(info.scores, expected, rtol=1e-10)
    best = int(np.argmin(expected))
    assert info.selected == (best,)
    assert info.weights == tuple(1.0 if i == best else 0.0 for i in range(n))
    for name in SHAPES:  # Krum's output IS the selected input, bit for bit
        np.testing.assert_array_equal(result[name], inputs[best][name], strict=True)


@pytest.mark.parametrize("seed", [211])
def test_multikrum_averages_the_best_m(seed: int) -> None:
    inputs = make_inputs(seed, 7)
    result, info = aggregate_with_info(
        inputs, AggregationParams("multikrum", byzantine=2, select=3)
    )
    ranked = np.argsort(reference_scores(inputs, 2), kind="stable")
    assert info.selected == tuple(sorted(int(i) for i in ranked[:3]))
    expected = mean([inputs[i] for i in info.selected])
    for name in SHAPES:
        np.testing.assert_array_equal(result[name], expected[name], strict=True)
    # select defaults to n - f
    _, default = aggregate_with_info(inputs, AggregationParams("multikrum", byzantine=2))
    assert default.selected is not None and len(default.selected) == 5


def test_ties_go_to_the_lowest_index() -> None:
    same = {"x": np.ones(10, np.float32)}
    inputs = [same, same, same, same, same]
    _, info = aggregate_with_info(inputs, AggregationParams("krum", byzantine=1))
    assert info.selected == (0,)
    _, info = aggregate_with_info(inputs, AggregationParams("multikrum", byzantine=1, select=2))
    assert info.selected == (0, 1)


def test_distances_do_not_cancel_on_large_nearly_equal_inputs() -> None:
    # |x|^2 ~ 1e12 while the distances are ~1e-6: a plain |xi|^2 + |xj|^2 - 2 xi.xj in float64
    # loses them; subtracting input 0 first keeps them.
    base = np.full(1000, 1000.0, np.float64)
    offsets = [0.0, 1e-6, 2.5e-6, 4e-6, 50e-6]  # scores 7.25, 3.25, 4.5, 11.25, ... (x 1e-9)
    inputs = [{"x": base + d} for d in offsets]
    _, info = aggregate_with_info(inputs, AggregationParams("krum", byzantine=1))
    expected = reference_scores(inputs, 1)
    assert info.scores is not None
    np.testing.assert_allclose(info.scores, expected, rtol=1e-6)
    assert info.selected == (1,)


@pytest.mark.parametrize("seed", [221, 222])
def test_byzantine_inputs_are_never_selected(seed: int) -> None:
    rng = np.random.default_rng(seed)
    honest = [{"g": rng.normal(1.0, 0.1, 500).astype(np.float32)} for _ in range(5)]
    attackers = [
        {"g": np.full(500, 1e4, np.float32)},
        {"g": rng.normal(-50, 1, 500).astype(np.float32)},
    ]
    inputs = [honest[0], attackers[0], *honest[1:3], attackers[1], *honest[3:]]
    result = krum(inputs, 2)
    assert any(np.array_equal(result["g"], h["g"]) for h in honest)
    _, info = aggregate_with_info(inputs, AggregationParams("multikrum", byzantine=2))
    assert info.selected is not None and not {1, 4} & set(info.selected)
    assert np.all(np.abs(multikrum(inputs, 2)["g"] - 1.0) < 0.5)


@pytest.mark.parametrize("seed", [241])
def test_scores_do_not_depend_on_threads(seed: int) -> None:
    # 1 Mi + 5 elements: two work chunks, each with its own Gram matrix
    rng = np.random.default_rng(seed)
    inputs = [{"big": rng.standard_normal((1 << 20) + 5, dtype=np.float32)} for _ in range(5)]
    params = AggregationParams("krum", byzantine=1)
    one = aggregate_with_info(inputs, params, threads=1)[1]
    two = aggregate_with_info(inputs, params, threads=2)[1]
    assert one.scores == two.scores and one.selected == two.selected


@pytest.mark.parametrize("seed", [231])
def test_repeatable(seed: int) -> None:
    inputs = make_inputs(seed, 6)
    a, ia = aggregate_with_info(inputs, AggregationParams("multikrum", byzantine=1))
    b, ib = aggregate_with_info(inputs, AggregationParams("multikrum", byzantine=1))
    assert ia == ib
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


def test_selection_ignores_last_bit_differences_in_scores() -> None:
    """Another machine's BLAS may round the distances differently in the last bits: the
    selection, and so the output CID an auditor re-derives, must not change."""
    from gradstore.aggregate._krum import RANK_DIGITS, select_lowest

    base = [10.0, 10.0, 12.5, 30.0]
    nudged = [10.0 * (1 + 4e-16), 10.0, 12.5, 30.0]  # score 0 a few ulps higher
    assert select_lowest(base, 1) == select_lowest(nudged, 1) == (0,)
    assert select_lowest(base, 2) == select_lowest(nudged, 2) == (0, 1)
    clearly = [10.0 * (1 + 10.0 ** -(RANK_DIGITS - 2)), 10.0, 12.5, 30.0]  # a real difference
    assert select_lowest(clearly, 1) == (1,)
