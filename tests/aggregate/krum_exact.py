"""Krum as docs/spec.md (section 6.6) defines it: scores from exact distances, ranked at 9
significant digits, ties to the lower index; the reference for the coordinator's selection."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import product
from typing import Any

import numpy as np

Flat = dict[str, np.ndarray[Any, Any]]

#: The spec's borderline margin: a score this close (relative) to a key boundary may take
#: either neighbouring key (section 6.6, "What an auditor does near a tie").
BORDERLINE: float = 1e-11


def clipped(flats: Sequence[Flat], scales: Sequence[float] | None) -> list[np.ndarray[Any, Any]]:
    """Each input's elements ``y_i = fl(x_i * s_i)`` as one float64 vector (tensors in name order)."""
    out = []
    for i, flat in enumerate(flats):
        y = np.concatenate([np.ravel(flat[name]).astype(np.float64) for name in sorted(flat)])
        out.append(y if scales is None else y * np.float64(scales[i]))
    return out


def exact_distances(flats: Sequence[Flat], scales: Sequence[float] | None = None) -> np.ndarray:
    """``d(i, j) = sum_e (y_i[e] - y_j[e])^2`` summed with ``math.fsum`` (one rounding).

    The differences and squares are binary64, as the spec's reference takes them: within a
    few 2^-53 of exact, far inside the borderline margin.
    """
    ys = clipped(flats, scales)
    n = len(ys)
    dist = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            dist[i, j] = dist[j, i] = math.fsum(np.square(ys[i] - ys[j]).tolist())
    return dist


def exact_scores(dist: np.ndarray, byzantine: int) -> list[float]:
    """``S_i``: the fsum of the n - f - 2 smallest distances from i to the others."""
    n = dist.shape[0]
    return [
        math.fsum(sorted(float(dist[i, j]) for j in range(n) if j != i)[: n - byzantine - 2])
        for i in range(n)
    ]


def rank_key(score: float) -> float:
    """The score at 9 significant digits (section 6.6, step 3)."""
    return float(f"{score:.8e}")


def possible_selections(scores: Sequence[float], m: int) -> set[tuple[int, ...]]:
    """Every selection the spec allows: a borderline score may take either neighbouring key."""
    choices = [
        sorted({rank_key(s * (1 - BORDERLINE)), rank_key(s), rank_key(s * (1 + BORDERLINE))})
        for s in scores
    ]
    possible = set()
    for keys in product(*choices):
        ranked = sorted(range(len(scores)), key=lambda i: (keys[i], i))
        possible.add(tuple(sorted(ranked[:m])))
    return possible
