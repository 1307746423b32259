"""Krum's memory is bounded: block rows sized by the tensor, no pairwise Python loops, and
at most MAX_KRUM_INPUTS inputs; its distances and scores are those of the pairwise loops and
within the spec's margin of the exact ones."""

from __future__ import annotations

import asyncio
import math
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import pytest

from gradstore.aggregate import (
    AggregationParams,
    InMemory,
    Layout,
    aggregate_streamed,
    aggregate_with_info,
)
from gradstore.aggregate._blocks import CHUNK
from gradstore.aggregate._krum import (
    BLOCK,
    distances_from_gram,
    krum_scores,
    select_lowest,
    squared_distances,
)
from gradstore.aggregate.methods import MAX_KRUM_INPUTS
from gradstore.errors import AggregationError, TooManyInputsError

from .krum_exact import (
    BORDERLINE,
    exact_distances,
    exact_scores,
    possible_selections,
)

Flat = dict[str, np.ndarray[Any, Any]]
T = TypeVar("T")
_F64 = np.dtype(np.float64)


# --- pairwise loops: what the vectorised passes must equal bit for bit --------------------


def loop_distances_from_gram(gram: np.ndarray) -> np.ndarray:
    n = gram.shape[0]
    dist = np.zeros((n, n), _F64)
    for i in range(n):
        for j in range(i + 1, n):
            d = max(0.0, float(gram[i, i] + gram[j, j] - 2.0 * gram[i, j]))
            dist[i, j] = dist[j, i] = d
    return dist


def loop_krum_scores(dist: np.ndarray, byzantine: int) -> list[float]:
    n = dist.shape[0]
    closest = n - byzantine - 2
    scores = []
    for i in range(n):
        others = sorted(float(dist[i, j]) for j in range(n) if j != i)
        scores.append(math.fsum(others[:closest]))
    return scores


# ---------------------------------------------------------------------------------------


def _inputs(rng: np.random.Generator, n: int, shapes: dict[str, tuple[int, ...]]) -> list[Flat]:
    centre = {k: rng.standard_normal(s) * 100 for k, s in shapes.items()}
    return [
        {
            k: (c + rng.normal(0, rng.uniform(0.01, 3.0), c.shape)).astype("<f4").ravel()
            for k, c in centre.items()
        }
        for _ in range(n)
    ]


def _layout(flat: Flat) -> Layout:
    return Layout.of((k, a.dtype, a.shape) for k, a in flat.items())


SHAPES: list[dict[str, tuple[int, ...]]] = [
    {"w": (10,)},  # one tiny tensor: rows of 10 columns (a block's before)
    {"a": (3, 7), "b": (BLOCK + 17,), "s": ()},  # a partial block after a whole one
    {"big": (CHUNK + 5,), "t": (40,)},  # two chunks, two worker threads
]


def _relative_error(got: Sequence[float], want: Sequence[float]) -> float:
    return max(abs(g - w) / w for g, w in zip(got, want, strict=True) if w)


@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "-".join(s))
@pytest.mark.parametrize("seed", [1, 2])
def test_distances_scores_and_selection_match_the_exact_ones(
    shapes: dict[str, tuple[int, ...]], seed: int
) -> None:
    """Within the spec's margin of the exact distances (docs/spec.md, section 6.6), whatever
    the threads (which give the same bits), and selecting as they do."""
    rng = np.random.default_rng(seed)
    n = 9 if "big" in shapes else 23
    flats = _inputs(rng, n, shapes)
    layout = _layout(flats[0])
    for scales in (None, list(rng.uniform(0.1, 1.0, n))):
        exact = exact_distances(flats, scales)
        got = squared_distances(flats, layout, scales, 1)
        again = squared_distances(flats, layout, scales, 2)
        assert got.tobytes() == again.tobytes(), (shapes, seed, scales is None)
        off = ~np.eye(n, dtype=bool)
        assert _relative_error(got[off].tolist(), exact[off].tolist()) < BORDERLINE
        for f in (0, 1, (n - 3) // 2):
            scores, want = krum_scores(got, f), exact_scores(exact, f)
            assert _relative_error(scores, want) < BORDERLINE
            for m in (1, n - f):
                assert select_lowest(scores, m) in possible_selections(want, m)


@pytest.mark.parametrize("n", [3, 4, 17, 120])
def test_distances_from_any_gram_matrix_keep_the_loops_bits(n: int) -> None:
    """Random (also non-symmetric and negative-distance) Gram matrices: the vectorised pass
    reads the upper triangle and clamps at 0.0 exactly as a pairwise loop does."""
    rng = np.random.default_rng(n)
    for scale in (1.0, 1e-300, 1e150):
        x = rng.standard_normal((n, 5)) * scale
        gram = x @ x.T
        noisy = gram + rng.standard_normal(gram.shape) * abs(gram).max() * 1e-3
        rounded = np.round(gram, 1)  # exact ties and zero distances
        for g in (gram, noisy, rounded):
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                want = loop_distances_from_gram(g)
            got = distances_from_gram(g)
            assert got.tobytes() == want.tobytes(), (n, scale)
            for f in range(0, (n - 3) // 2 + 1, max(1, n // 7)):
                assert krum_scores(got, f) == loop_krum_scores(want, f)


def test_aggregates_select_as_the_exact_distances_do() -> None:
    """The whole aggregation, in memory and streamed: scores within the spec's margin of the
    exact ones, their selection, and the same bits in both paths."""
    rng = np.random.default_rng(7)
    flats = _inputs(rng, 15, {"a": (3, 7), "b": (BLOCK + 17,), "s": ()})
    layout = _layout(flats[0])
    for params in (
        AggregationParams("krum", byzantine=3),
        AggregationParams("multikrum", byzantine=2, clip_input_norm=900.0),
    ):
        result, info = aggregate_with_info(flats, params)
        assert info.scores is not None and info.selected is not None
        scales = None if info.input_scales is None else list(info.input_scales)
        want = exact_scores(exact_distances(flats, scales), params.byzantine or 0)
        assert _relative_error(info.scores, want) < BORDERLINE
        assert info.selected in possible_selections(want, len(info.selected))
        streamed, again = asyncio.run(
            aggregate_streamed([InMemory(f) for f in flats], layout, params, window_bytes=1 << 16)
        )
        assert again == info
        assert all(streamed[k].tobytes() == result[k].tobytes() for k in result)


def _peak(call: Callable[[], T]) -> tuple[T, int]:
    """``call()``'s result and the peak bytes traced while it ran (NumPy's buffers too)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = call()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _matrices(n: int) -> int:
    """Bytes of the three (n, n) float64 matrices Krum may hold at once."""
    return 3 * n * n * 8


@pytest.mark.parametrize("streamed", [False, True], ids=["in-memory", "streamed"])
def test_many_tiny_inputs_hold_their_matrices_not_a_block_row_each(streamed: bool) -> None:
    """Before: an (n, 32 Ki) float64 row buffer per thread (256 KiB per input, 256 MiB for
    1024 inputs of 10 floats) and O(n^2) Python loops; now rows of 10 floats."""
    n = MAX_KRUM_INPUTS
    rng = np.random.default_rng(3)
    flats = [{"w": rng.standard_normal(10).astype("<f4")} for _ in range(n)]
    layout = _layout(flats[0])
    params = AggregationParams("krum", byzantine=1)

    def run() -> Any:
        if streamed:
            sources = [InMemory(f) for f in flats]
            return asyncio.run(aggregate_streamed(sources, layout, params))[1]
        return aggregate_with_info(flats, params)[1]

    started = time.perf_counter()
    info, peak = _peak(run)
    seconds = time.perf_counter() - started
    assert peak < _matrices(n) + (8 << 20), f"{peak / 2**20:.0f} MiB"  # 24 MiB + tasks
    assert seconds < 20, f"{seconds:.1f} s"  # before: ~3 s plus tracing of the loops' floats
    assert info.selected is not None and len(info.selected) == 1


def test_the_bound_fits_its_memory_budget() -> None:
    """MAX_KRUM_INPUTS (methods/base.py): three (n, n) float64 matrices plus, per input, a
    float64 block row and a window of at most as much, within 1 GiB; twice as many not."""

    def worst(n: int) -> int:
        return _matrices(n) + n * 2 * BLOCK * 8

    assert worst(MAX_KRUM_INPUTS) <= 1 << 30 < worst(2 * MAX_KRUM_INPUTS)


@pytest.mark.parametrize("method", ["krum", "multikrum"])
def test_more_inputs_than_the_bound_are_refused_by_count_and_bound(method: str) -> None:
    params = AggregationParams(method, byzantine=1)
    params.validate(MAX_KRUM_INPUTS)
    with pytest.raises(TooManyInputsError) as caught:
        params.validate(MAX_KRUM_INPUTS + 1)
    err = caught.value
    assert isinstance(err, AggregationError)
    assert (err.method, err.count, err.bound) == (method, MAX_KRUM_INPUTS + 1, MAX_KRUM_INPUTS)
    assert f"{MAX_KRUM_INPUTS + 1} inputs" in str(err) and str(MAX_KRUM_INPUTS) in str(err)
    tiny = [{"w": np.zeros(1, np.float32)}] * (MAX_KRUM_INPUTS + 1)
    with pytest.raises(TooManyInputsError):
        aggregate_with_info(tiny, params)
    with pytest.raises(TooManyInputsError):
        asyncio.run(aggregate_streamed([InMemory(t) for t in tiny], _layout(tiny[0]), params))
