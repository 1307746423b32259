"""Krum and multi-Krum (Blanchard et al., NeurIPS 2017): keep the inputs closest to the rest.

Distances are squared L2 over all tensors. They come from a float64 Gram matrix
accumulated block by block, after subtracting input 0 from every input in that block
(exact for float32 values of similar magnitude): ``d(i, j) = |y_i|^2 + |y_j|^2 - 2 y_i.y_j`` with
``y = x - x_0``, so the cancellation is relative to the distances between inputs, not to
their norms. Chunks run on threads, each with its own Gram matrix, summed in chunk
order. The block products use BLAS, whose rounding may differ between machines in
the last bits; the output is bit-identical whenever the same inputs are selected.

score(i) = sum of the n - f - 2 smallest distances from i to the others. Krum selects the
lowest score (ties: lowest index); multi-Krum selects the m lowest (Blanchard's
non-iterative variant) and averages them in input order. Scores are ranked at
``RANK_DIGITS`` significant digits, so last-bit differences between machines' BLAS
cannot change the selection (and with it the output CID).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from ._blocks import Scratch, blocks, chunks, run
from ._checks import Flat, Layout, NonFiniteResult

#: Elements per block: an (n, 32 Ki) float64 work array, large enough for BLAS to be efficient.
BLOCK: Final = 1 << 15

_F64: Final = np.dtype(np.float64)


def squared_distances(
    flats: Sequence[Flat], layout: Layout, scales: Sequence[float] | None, threads: int
) -> np.ndarray:
    """The symmetric (n, n) float64 matrix of squared L2 distances between (clipped) inputs.

    Each work chunk accumulates its own Gram matrix; the chunks' matrices are then added in
    chunk order, so the result does not depend on ``threads``.
    """
    items = chunks(layout)
    partial: dict[tuple[str, int], np.ndarray] = {}
    scratch = Scratch()

    def work(name: str, start: int, stop: int) -> None:
        partial[name, start] = chunk_gram(flats, name, start, stop, scales, scratch)

    run(work, items, threads)
    gram = np.zeros((len(flats) - 1, len(flats) - 1), _F64)
    for name, start, _ in items:
        gram += partial[name, start]
    return distances_from_gram(gram)


def chunk_gram(
    flats: Sequence[Flat],
    name: str,
    start: int,
    stop: int,
    scales: Sequence[float] | None,
    scratch: Scratch | None = None,
) -> np.ndarray:
    """The (n-1, n-1) Gram matrix of one chunk of tensor ``name``, inputs centred on input 0.

    ``flats[i][name][start:stop]`` are the chunk's elements. Summing the chunks' matrices
    in ``chunks(layout)`` order gives :func:`squared_distances`'s matrix, so a caller that
    holds one chunk of every input at a time gets the same bits.
    """
    n = len(flats)
    factors = None if scales is None else [np.float64(s) for s in scales]
    buf = (scratch or Scratch()).get("rows", (n, BLOCK), _F64)
    gram = np.zeros((n - 1, n - 1), _F64)
    # NaN/Inf show in the Gram matrix (distances_from_gram): no warnings on the way, where
    # the streamed path calls this outside ``run`` and a signalling NaN warns when widened
    with np.errstate(over="ignore", invalid="ignore"):
        for lo, hi in blocks(start, stop, BLOCK):
            rows = buf[:, : hi - lo]
            for i in range(n):
                if factors is None:
                    np.copyto(rows[i], flats[i][name][lo:hi])
                else:
                    np.multiply(flats[i][name][lo:hi], factors[i], out=rows[i], dtype=_F64)
            centred = rows[1:]
            np.subtract(centred, rows[0], out=centred)
            gram += np.dot(centred, centred.T)  # np.dot releases the GIL; matmul did not
    return gram


def distances_from_gram(gram: np.ndarray) -> np.ndarray:
    """Squared distances from the summed Gram matrix (NonFiniteResult if it overflowed)."""
    if not np.isfinite(gram).all():
        raise NonFiniteResult(None)
    n = gram.shape[0] + 1
    full = np.zeros((n, n), _F64)
    full[1:, 1:] = gram
    dist = np.zeros((n, n), _F64)
    for i in range(n):
        for j in range(i + 1, n):
            d = max(0.0, float(full[i, i] + full[j, j] - 2.0 * full[i, j]))
            dist[i, j] = dist[j, i] = d
    return dist


def krum_scores(dist: np.ndarray, byzantine: int) -> list[float]:
    """Each input's Krum score: the exact sum of its n - f - 2 smallest distances to others."""
    n = dist.shape[0]
    closest = n - byzantine - 2
    scores = []
    for i in range(n):
        others = sorted(float(dist[i, j]) for j in range(n) if j != i)
        scores.append(math.fsum(others[:closest]))
    return scores


#: Scores are ranked at this many significant digits. BLAS may round the Gram matrix
#: differently on another machine (last bits only); ranking coarser than that makes an
#: auditor elsewhere select the same inputs, and so re-derive the same output CID.
RANK_DIGITS: Final = 9


def select_lowest(scores: Sequence[float], m: int) -> tuple[int, ...]:
    """Indices of the ``m`` lowest scores (ties, to ``RANK_DIGITS``: lower index first), in index order."""
    ranked = sorted(range(len(scores)), key=lambda i: (_rank_key(scores[i]), i))
    return tuple(sorted(ranked[:m]))


def _rank_key(score: float) -> float:
    return float(f"{score:.{RANK_DIGITS - 1}e}")
