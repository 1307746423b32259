"""Krum and multi-Krum (Blanchard et al., NeurIPS 2017): keep the inputs closest to the rest.

Distances are squared L2 over all tensors. They come from a float64 Gram matrix
accumulated block by block, after subtracting from every input in that block the block's
coordinate-wise (lower) median: ``d(i, j) = |z_i|^2 + |z_j|^2 - 2 z_i.z_j`` with
``z = y - median``. The rounding error of ``d(i, j)`` is about 2^-52 (|z_i|^2 + |z_j|^2),
and with fewer than half the inputs hostile every coordinate of the median lies between two
honest inputs' values, so the honest inputs' distances are accurate to their own spread
whatever a minority sends (centred on input 0, a far input 0 made them inaccurate).
Chunks run on threads, each with its own Gram matrix, summed in chunk order. The block
products use BLAS, whose rounding may differ between machines in the last bits; the
output is bit-identical whenever the same inputs are selected.

score(i) = sum of the n - f - 2 smallest distances from i to the others. Krum selects the
lowest score (ties: lowest index); multi-Krum selects the m lowest (Blanchard's
non-iterative variant) and averages them in input order. Scores are ranked at
``RANK_DIGITS`` significant digits, so last-bit differences between machines' BLAS
cannot change the selection (and with it the output CID).

Memory: the block rows are as wide as the tensor when it is smaller than a block, the
median goes a strip of columns at a time, and the (n, n) passes go a few rows at a time,
so besides its inputs Krum holds a few (n, n) float64 matrices and one float64 block row
per input; ``methods.base.MAX_KRUM_INPUTS`` bounds n so that this stays bounded
(docs/design/aggregation.md, "Krum takes at most 1024 inputs").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import numpy as np

from ._blocks import Scratch, blocks, chunks
from ._checks import Flat, Layout, NonFiniteResult
from ._network import Comparator, selection_network, sort_rows

#: Elements per block: an (n, 32 Ki) float64 work array, large enough for BLAS to be efficient.
#: The block boundaries are part of the arithmetic (each block's product is added on its own).
BLOCK: Final = 1 << 15

#: Bytes of each (rows, n) temporary the distance and score passes hold at a time.
ROW_BYTES: Final = 1 << 20

#: Bytes of block rows (one (n, BLOCK) float64 array per worker thread) the in-memory kernel
#: holds at once: with many inputs it runs on fewer threads (the result does not change).
ROWS_BUDGET: Final = 512 << 20

#: Inputs up to which a block's median comes from a sorting network of NumPy minimum and
#: maximum over rows (``_network``, as the median method's); above, from
#: ``ndarray.partition``, whose per-column cost makes it several times slower for few
#: inputs. Both give the lower median (up to the sign of a zero, which no distance sees).
NETWORK_INPUTS: Final = 32

_F64: Final = np.dtype(np.float64)
_F32: Final = np.dtype(np.float32)

#: Input dtypes whose values are all float32 values (the median strip can be float32).
_NARROW: Final = frozenset({np.dtype("<f4"), np.dtype(">f4"), np.dtype("<f2"), np.dtype(">f2")})


def squared_distances(
    flats: Sequence[Flat], layout: Layout, scales: Sequence[float] | None, threads: int
) -> np.ndarray:
    """The symmetric (n, n) float64 matrix of squared L2 distances between (clipped) inputs.

    Each work chunk accumulates its own Gram matrix; the chunks' matrices are then added in
    chunk order, so the result does not depend on ``threads``. At most ``threads`` chunk
    matrices are held at a time, and each thread's block rows are as wide as the largest
    chunk needs (``row_width``), not a whole block for tiny tensors.
    """
    n = len(flats)
    items = chunks(layout)
    width = row_width(max((stop - start for _, start, stop in items), default=0))
    threads = max(1, min(threads, ROWS_BUDGET // max(1, n * width * _F64.itemsize)))
    scratch = Scratch()
    gram = np.zeros((n, n), _F64)

    def gram_of(item: tuple[str, int, int]) -> np.ndarray:
        rows = scratch.get("rows", (n, width), _F64)
        return chunk_gram(flats, *item, scales, rows)

    if threads == 1 or len(items) <= 1:
        for item in items:
            gram += gram_of(item)
    else:
        with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="aggregate") as pool:
            for first in range(0, len(items), threads):  # `threads` matrices held at most
                for part in pool.map(gram_of, items[first : first + threads]):
                    gram += part
    return distances_from_gram(gram)


def row_width(elements: int) -> int:
    """Columns of the block rows for a chunk of ``elements``: a block, or one more column than
    a smaller chunk has.

    The extra column keeps a partial block's rows a strided view, as they were in a whole
    block's buffer: NumPy multiplies a contiguous matrix by its transpose with BLAS's
    ``syrk`` and a strided one with ``gemm``, which round differently (and ``gemm``'s
    result does not depend on the row stride). Whole blocks stay contiguous.
    """
    return BLOCK if elements >= BLOCK else elements + 1


def chunk_gram(
    flats: Sequence[Flat],
    name: str,
    start: int,
    stop: int,
    scales: Sequence[float] | None,
    rows: np.ndarray | None = None,
    gram: np.ndarray | None = None,
) -> np.ndarray:
    """The (n, n) Gram matrix of one chunk of tensor ``name``, each block centred on its
    coordinate-wise median.

    ``flats[i][name][start:stop]`` are the chunk's elements. Summing the chunks' matrices
    in ``chunks(layout)`` order gives :func:`squared_distances`'s matrix, so a caller that
    holds one chunk of every input at a time gets the same bits (the median of an element
    depends on that element's values only). ``rows``: an (n, w) float64 work array with
    w >= ``row_width(stop - start)`` (else one is made). ``gram``: add to this matrix (a
    caller that reads a chunk in pieces of whole blocks passes the piece's matrix on)
    instead of a new zero one.
    """
    n = len(flats)
    factors = None if scales is None else [np.float64(s) for s in scales]
    if rows is None:
        rows = np.empty((n, row_width(stop - start)), _F64)
    if gram is None:
        gram = np.zeros((n, n), _F64)
    # the median of float32 values is one of them: found in float32, about twice as fast
    exact = _F32 if scales is None and all(f[name].dtype in _NARROW for f in flats) else _F64
    strip = np.empty((n + 1, min(rows.shape[1], _strip_columns(n, exact))), exact)
    # NaN/Inf show in the Gram matrix (distances_from_gram): no warnings on the way, where
    # the streamed path calls this outside ``run`` and a signalling NaN warns when widened
    with np.errstate(over="ignore", invalid="ignore"):
        for lo, hi in blocks(start, stop, BLOCK):
            block = rows[:, : hi - lo]
            for i in range(n):
                if factors is None:
                    np.copyto(block[i], flats[i][name][lo:hi])
                else:
                    np.multiply(flats[i][name][lo:hi], factors[i], out=block[i], dtype=_F64)
            centre_on_median(block, strip)
            gram += np.dot(block, block.T)  # np.dot releases the GIL; matmul did not
    return gram


def centre_on_median(block: np.ndarray, strip: np.ndarray) -> None:
    """Subtract from each column of the (n, w) ``block`` its lower median (the
    ``(n - 1) // 2``-th smallest of its n values), a strip of columns at a time.

    A minority cannot move that median outside the range of the other inputs' values, so
    the centred honest rows are as small as the honest inputs' spread. ``strip``: an
    (n + 1, s) scratch array, s >= 1, float64, or float32 when every value in ``block`` is
    a float32 value (the median is then the same). A NaN or infinity in a column leaves
    one in a centred value of that column (the Gram matrix then is not finite).
    """
    n, width = block.shape
    middle = (n - 1) // 2
    network = selection_network(n, (middle,)) if n <= NETWORK_INPUTS else None
    for lo, hi in blocks(0, width, strip.shape[1]):
        part = block[:, lo:hi]
        work = strip[:, : hi - lo]
        np.copyto(work[:n], part)
        if network is None:
            values = work[:n]
            values.partition(middle, axis=0)
            median = values[middle]
        else:
            median = _network_select(work, network, middle)
        np.subtract(part, median, out=part)


def _network_select(work: np.ndarray, network: Sequence[Comparator], middle: int) -> np.ndarray:
    """Row ``middle`` of the first n rows of ``work`` once ``network`` has sorted them column
    by column (row n is spare)."""
    return sort_rows([work[i] for i in range(work.shape[0])], network)[middle]


def _strip_columns(n: int, dtype: np.dtype[Any]) -> int:
    """Columns of the median's (n + 1)-row scratch strip: within ``ROW_BYTES``."""
    return max(1, ROW_BYTES // ((n + 1) * dtype.itemsize))


def distances_from_gram(gram: np.ndarray) -> np.ndarray:
    """Squared distances from the summed (n, n) Gram matrix (NonFiniteResult if it overflowed).

    ``d(i, j) = max(0, (G_ii + G_jj) - 2 G_ij)`` for i < j, mirrored, NaN taken as 0: row
    blocks at a time, no Python loop.
    """
    if not np.isfinite(gram).all():
        raise NonFiniteResult(None)
    n = gram.shape[0]
    norms = gram.diagonal()
    dist = np.empty((n, n), _F64)
    columns = np.arange(n)
    with np.errstate(over="ignore", invalid="ignore"):
        for lo, hi in blocks(0, n, _rows_at_once(n)):
            # G_ij from the upper triangle (j > i), as the pairwise loop read it
            upper = columns[None, :] > np.arange(lo, hi)[:, None]
            pair = np.empty((hi - lo, n), _F64)
            np.copyto(pair, gram[lo:hi], where=upper)
            np.copyto(pair, gram[:, lo:hi].T, where=~upper)
            d = np.add(norms[lo:hi, None], norms[None, :])
            d -= np.multiply(pair, 2.0, out=pair)
            out = dist[lo:hi]
            out.fill(0.0)
            np.copyto(out, d, where=d > 0.0)  # max(0.0, d): NaN and -0.0 give +0.0
    np.fill_diagonal(dist, 0.0)
    return dist


def krum_scores(dist: np.ndarray, byzantine: int) -> list[float]:
    """Each input's Krum score: the exact sum of its n - f - 2 smallest distances to others.

    A row's own distance is 0.0, never above another: the ``closest + 1`` smallest of the
    whole row are the ``closest`` smallest of the others and a zero, and ``math.fsum`` is
    exact, so neither the zero nor the order changes the sum.
    """
    n = dist.shape[0]
    closest = n - byzantine - 2
    if not 0 < closest < n:
        raise ValueError(f"krum_scores: {n} inputs leave no distance to sum with f={byzantine}")
    scores: list[float] = []
    for lo, hi in blocks(0, n, _rows_at_once(n)):
        smallest = np.partition(dist[lo:hi], closest, axis=1)[:, : closest + 1]
        scores.extend(math.fsum(row.tolist()) for row in smallest)  # a row's floats at a time
    return scores


def _rows_at_once(n: int) -> int:
    return max(1, ROW_BYTES // (n * _F64.itemsize))


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
