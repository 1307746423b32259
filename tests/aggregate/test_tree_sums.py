"""A tree round's arithmetic (docs/spec.md, section 9.5): the groups' exact partial sums,
combined, give the same bits whatever the grouping (the flat round's: one group of all),
keep -0.0, and a hostile partial is refused before it is added."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gradstore.aggregate import (
    MAX_PARTIAL_COMPONENTS,
    Layout,
    check_partial_tensors,
    combine_partials,
    partial_sums,
)
from gradstore.errors import AggregationError

LAYOUT = Layout.of([("w", np.dtype(np.float32), (2, 3)), ("b", np.dtype(np.float64), (4,))])


def inputs(n: int, seed: int = 7) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        scale = 10.0 ** rng.integers(-30, 30, size=4)
        out.append(
            {
                "w": (rng.standard_normal(6) * 1e3).astype(np.float32),
                "b": rng.standard_normal(4) * scale,
            }
        )
    return out


def groupings(n: int) -> list[list[list[int]]]:
    """A few ways to cut ``range(n)`` into groups (order within and across shuffled)."""
    idx = list(range(n))
    return [[idx], [idx[:1], idx[1:]], [idx[::2], idx[1::2]], [[i] for i in reversed(idx)]]


def test_any_grouping_gives_the_flat_bits_and_the_exact_sum() -> None:
    flats = inputs(5)
    coefs = [3.0, 1.0, 7.0, 2.0, 5.0]
    divisor = math.fsum(coefs)
    flat = combine_partials([partial_sums(flats, LAYOUT, coefs)], LAYOUT, divisor)
    for groups in groupings(5):
        parts = [partial_sums([flats[i] for i in g], LAYOUT, [coefs[i] for i in g]) for g in groups]
        for order in itertools.permutations(parts):
            got = combine_partials(list(order), LAYOUT, divisor)
            for name in LAYOUT.names:
                assert got[name].tobytes() == flat[name].tobytes(), (groups, name)
    for j in range(4):  # the exact sum rounded once, then divided
        terms = [float(np.float64(c) * f["b"][j]) for c, f in zip(coefs, flats, strict=True)]
        assert flat["b"][j] == math.fsum(terms) / divisor


def test_cancellation_that_an_ordered_sum_loses_is_kept() -> None:
    layout = Layout.of([("x", np.dtype(np.float64), (1,))])
    flats = [{"x": np.array([v])} for v in (1e300, 1.0, -1e300)]
    parts = [partial_sums(flats[:1], layout, None), partial_sums(flats[1:], layout, None)]
    assert combine_partials(parts, layout, None)["x"][0] == 1.0
    assert parts[1]["x"].shape[0] == 2  # -1e300 + 1 needs two components


def test_minus_zero_survives_the_tree_only_when_every_term_is_minus_zero() -> None:
    layout = Layout.of([("x", np.dtype(np.float32), (2,))])
    neg = {"x": np.array([-0.0, -0.0], np.float32)}
    mixed = {"x": np.array([-0.0, 0.0], np.float32)}
    parts = [partial_sums([neg], layout, None), partial_sums([neg, neg], layout, None)]
    out = combine_partials(parts, layout, 3.0)["x"]
    assert math.copysign(1.0, out[0]) < 0 and math.copysign(1.0, out[1]) < 0
    out = combine_partials([parts[0], partial_sums([mixed], layout, None)], layout, None)["x"]
    assert math.copysign(1.0, out[0]) < 0 and math.copysign(1.0, out[1]) > 0


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"x": np.full((1, 2), np.nan)}, "NaN or Inf"),
        ({"x": np.zeros((MAX_PARTIAL_COMPONENTS + 1, 2))}, "41 components"),
        ({"x": np.zeros((1, 3))}, "not float64"),
        ({"x": np.zeros((1, 2), np.float32)}, "not float64"),
        ({"y": np.zeros((1, 2))}, "not the round's"),
    ],
)
def test_a_hostile_partial_is_refused_before_it_is_added(
    bad: dict[str, np.ndarray], match: str
) -> None:
    layout = Layout.of([("x", np.dtype(np.float32), (2,))])
    with pytest.raises(AggregationError, match=match):
        check_partial_tensors(bad, layout, "group 'a'")
