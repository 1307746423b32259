"""Aggregation over inputs read piece by piece (``InputSource``), never all in memory.

Every method gives the bits :func:`aggregate_with_info` gives over the same inputs in the
same order, because each element sees the same IEEE operations in the same order:

- the coordinate-wise methods (sum, mean, fedavg, weighted, median, trimmed_mean) run
  their kernels window by window: a window of every input at a time, O(inputs x window)
  plus the output;
- sum, mean, fedavg and weighted, when that would hold too much (many inputs), add one
  input at a time into a float64 accumulator instead: O(model); with ``accumulate =
  "exact"`` they stay windowed, in windows as small as ``EXACT_MIN_WINDOW`` elements;
- Krum sums its Gram matrix chunk by chunk in ``chunks(layout)`` order, exactly as the
  in-memory kernel does (each chunk read in pieces of whole blocks, all inputs' pieces
  within the window bytes), then averages the inputs it selected like the linear methods;
- output clipping (round/4) has the method write the float64 aggregate, whose norm sets
  the scale before the one rounding to the dtype;
- input clipping needs each input's global norm: the caller passes the norms it took
  when it verified the inputs (:func:`global_norm`), or a first pass takes them, block by
  block in the same order as :func:`global_norm`.

Compressed inputs (``_compressed``) read as float64, decompressed range by range; with a
sparse one among them, the linear methods take the one-input-at-a-time path, where a
sparse input adds its kept entries only (docs/design/compression.md, "Aggregating compressed
inputs").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final, Protocol

import numpy as np

from ..errors import AggregationError
from ..format import is_float
from . import methods
from ._blocks import CHUNK, blocks, chunks, default_threads
from ._checks import Layout, NonFiniteResult, dtype_name
from ._clip import NormSum, SquareSum, clip_output_into, clip_then_round, input_scales
from ._compressed import Decompressing, SparseSource
from ._dispatch import AggregationInfo
from ._exact import combine_exact, exact_partial, join_pieces
from ._krum import BLOCK, chunk_gram, distances_from_gram, krum_scores, row_width
from ._linear import combine
from ._params import AggregationParams
from ._plans import linear_plan, selection_plan
from ._robust import order_mean
from ._rounding import round_into

#: Bytes of input windows held at once (all inputs together) by the windowed path.
DEFAULT_WINDOW_BYTES: Final = 64 << 20

#: The smallest window, in elements: a multiple of every kernel's block.
MIN_WINDOW: Final = 1 << 16

#: The largest window, in elements: a chunk for each of up to four worker threads.
MAX_WINDOW: Final = 4 * CHUNK

#: The smallest window of the exact mode, in elements (16 of its kernel's blocks).
EXACT_MIN_WINDOW: Final = 1 << 12

_F64: Final = np.dtype(np.float64)


class InputSource(Protocol):
    """One input, read a range of one tensor at a time (sequentially, in name order)."""

    async def read(self, name: str, start: int, stop: int) -> np.ndarray[Any, Any]:
        """Elements ``start .. stop`` of tensor ``name`` as a 1-D array of its dtype."""
        ...


class InMemory:
    """An ``InputSource`` over tensors already in memory (slices are views: no copy)."""

    def __init__(self, tensors: Any) -> None:
        self.flat = {name: np.ravel(array) for name, array in tensors.items()}

    async def read(self, name: str, start: int, stop: int) -> np.ndarray[Any, Any]:
        return self.flat[name][start:stop]


async def aggregate_streamed(
    sources: Sequence[InputSource],
    layout: Layout,
    params: AggregationParams,
    num_samples: Sequence[int] | None = None,
    *,
    norms: Sequence[float] | None = None,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    threads: int | None = None,
) -> tuple[dict[str, np.ndarray[Any, Any]], AggregationInfo]:
    """:func:`aggregate_with_info` over ``sources`` that all have ``layout``; same bits.

    ``norms``: each input's :func:`global_norm`, when ``clip_input_norm`` is set (else they
    are computed here, in one more pass over the inputs).
    """
    n, method, strategy = len(sources), params.method, params.strategy
    params.validate(n)
    linear = strategy.terms(n, num_samples) if isinstance(strategy, methods.Linear) else None
    for name in layout.names:
        if not is_float(layout.dtypes[name]):
            raise AggregationError(
                f"tensor {name!r} has dtype {dtype_name(layout.dtypes[name])}; "
                f"{method} aggregates floating-point tensors only"
            )
    workers = default_threads() if threads is None else max(1, int(threads))
    itemsize = max((layout.dtypes[name].itemsize for name in layout.names), default=1)
    if any(isinstance(source, Decompressing) for source in sources):
        itemsize = max(itemsize, _F64.itemsize)  # their windows arrive as float64
    info: dict[str, Any] = {}
    scales: list[float] | None = None
    if params.clip_input_norm is not None:
        if norms is None:
            norms = [await _norm(source, layout, params.norm_sum) for source in sources]
        scales = input_scales(norms, params.clip_input_norm)
        info["input_norms"], info["input_scales"] = tuple(norms), tuple(scales)

    window = _window(n, itemsize, window_bytes)
    # one input at a time (O(model)) when even the smallest windows of all inputs are too many
    one_by_one = n * MIN_WINDOW * itemsize > window_bytes
    # clipped once (round/4): the method writes float64, the clip rounds to the dtype
    once = params.clip_output_norm is not None and params.output_clip == "float64"
    work = layout.widened() if once else layout
    try:
        if linear is not None:
            coefs, divisor = linear_plan(linear, scales, n, info)
            if isinstance(strategy, methods.Linear) and strategy.exact:
                result = await _windowed(
                    sources,
                    work,
                    _exact_window(n, itemsize, window_bytes),
                    lambda flats, sub: combine_exact(flats, sub, coefs, divisor, workers),
                )
            else:
                result = await _linear(sources, work, coefs, divisor, window, workers, one_by_one)
        elif isinstance(strategy, methods.OrderStatistic):
            first, stop = strategy.rows(n)
            result = await _windowed(
                sources,
                work,
                window,
                lambda flats, sub: order_mean(flats, sub, first, stop, scales, workers),
            )
        else:
            assert isinstance(strategy, methods.Selection)
            dist = distances_from_gram(await _gram(sources, layout, scales, itemsize, window_bytes))
            scores = krum_scores(dist, strategy.f)
            del dist
            selected, coefs, divisor = selection_plan(strategy, scores, scales, n, info)
            chosen = [sources[i] for i in selected]
            result = await _linear(chosen, work, coefs, divisor, window, workers, one_by_one)
        if once:
            assert params.clip_output_norm is not None
            wide, result = result, layout.empty()
            info["output_norm"], info["output_scale"] = await asyncio.to_thread(
                clip_then_round,
                wide,
                result,
                params.clip_output_norm,
                method,
                params.norm_sum,
                isinstance(strategy, methods.OrderStatistic),
            )
            del wide
    except NonFiniteResult as exc:
        where = "the inputs" if exc.name is None else f"tensor {exc.name!r}"
        raise AggregationError(
            f"{method}: aggregating {where} gives NaN or infinity (an input holds one, "
            "or the sum overflows its dtype)"
        ) from None

    if params.clip_output_norm is not None and not once:
        norm, scale = clip_output_into(result, params.clip_output_norm, method, params.norm_sum)
        info["output_norm"], info["output_scale"] = norm, scale
    return result, AggregationInfo(method, n, **info)


def _window(n: int, itemsize: int, window_bytes: int) -> int:
    """Elements per window: every input's window together within ``window_bytes`` (at least
    ``MIN_WINDOW``; at most ``MAX_WINDOW``, enough for every worker thread to take a chunk)."""
    fit = window_bytes // max(1, n * itemsize)
    return max(MIN_WINDOW, min(MAX_WINDOW, fit // MIN_WINDOW * MIN_WINDOW))


async def exact_partial_streamed(
    sources: Sequence[InputSource],
    layout: Layout,
    coefs: Sequence[float] | None,
    *,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    threads: int | None = None,
) -> dict[str, np.ndarray[Any, Any]]:
    """:func:`exact_partial` of ``sources`` (all with ``layout``), read a window at a time:
    the same arrays. ``coefs``: each input's coefficient, input clipping folded in (as
    ``linear_plan`` gives them). AggregationError for a NaN/Inf input or a group sum beyond
    binary64."""
    if not sources:
        raise AggregationError("exact partial: no inputs")
    workers = default_threads() if threads is None else max(1, int(threads))
    itemsize = max((layout.dtypes[name].itemsize for name in layout.names), default=1)
    if any(isinstance(source, Decompressing) for source in sources):
        itemsize = max(itemsize, _F64.itemsize)
    window = _exact_window(len(sources), itemsize, window_bytes)
    pieces: dict[str, list[np.ndarray[Any, Any]]] = {name: [] for name in layout.names}
    for name, start, stop in _windows(layout, window):
        flats = await _read_all(sources, name, start, stop)
        sub = _sub_layout(layout, name, stop - start)
        part = await asyncio.to_thread(exact_partial, flats, sub, coefs, workers)
        pieces[name].append(part[name])
    return {name: join_pieces(pieces[name], layout.size(name)) for name in layout.names}


def _exact_window(n: int, itemsize: int, window_bytes: int) -> int:
    """Elements per window of the exact mode, which has no one-input-at-a-time path (its
    per-element state is not one float64): every input's window together within
    ``window_bytes``, down to ``EXACT_MIN_WINDOW`` elements (more bytes then, with very
    many inputs), at most ``MAX_WINDOW``."""
    fit = window_bytes // max(1, n * itemsize)
    return max(EXACT_MIN_WINDOW, min(MAX_WINDOW, fit // EXACT_MIN_WINDOW * EXACT_MIN_WINDOW))


def _windows(layout: Layout, window: int) -> list[tuple[str, int, int]]:
    return [
        (name, start, min(start + window, layout.size(name)))
        for name in layout.names
        for start in range(0, layout.size(name), window)
    ]


def _sub_layout(layout: Layout, name: str, size: int) -> Layout:
    return Layout((name,), {name: (size,)}, {name: layout.dtypes[name]})


async def _read_all(
    sources: Sequence[InputSource], name: str, start: int, stop: int
) -> list[dict[str, np.ndarray[Any, Any]]]:
    parts = await asyncio.gather(*(source.read(name, start, stop) for source in sources))
    return [{name: part} for part in parts]


async def _windowed(
    sources: Sequence[InputSource], layout: Layout, window: int, kernel: Any
) -> dict[str, np.ndarray[Any, Any]]:
    """Run ``kernel(flats, sub_layout)`` on each window of every input; the next window is
    read while the current one is computed."""
    out = layout.empty()
    items = _windows(layout, window)
    if not items:
        return out
    pending = asyncio.ensure_future(_read_all(sources, *items[0]))
    try:
        for index, (name, start, stop) in enumerate(items):
            flats = await pending
            if index + 1 < len(items):
                pending = asyncio.ensure_future(_read_all(sources, *items[index + 1]))
            sub = _sub_layout(layout, name, stop - start)
            part = await asyncio.to_thread(kernel, flats, sub)
            out[name].reshape(-1)[start:stop] = part[name]
    finally:
        if not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
    return out


async def _linear(
    sources: Sequence[InputSource],
    layout: Layout,
    coefs: Sequence[float] | None,
    divisor: float | None,
    window: int,
    threads: int,
    one_by_one: bool,
) -> dict[str, np.ndarray[Any, Any]]:
    """sum/mean/fedavg/weighted: windowed over all inputs, or one input at a time into a
    float64 accumulator when the windows of all inputs would not fit, or when a sparse
    input can be added without being densified."""
    if not one_by_one and not any(isinstance(source, SparseSource) for source in sources):
        return await _windowed(
            sources,
            layout,
            window,
            lambda flats, sub: combine(flats, sub, coefs, divisor, threads),
        )
    return await _accumulated(sources, layout, coefs, divisor)


async def _accumulated(
    sources: Sequence[InputSource],
    layout: Layout,
    coefs: Sequence[float] | None,
    divisor: float | None,
) -> dict[str, np.ndarray[Any, Any]]:
    """``(sum_i coefs[i] * x_i) / divisor`` with one input in memory at a time: O(model).

    The same operations per element, in the same order, as ``_linear.combine``. A sparse
    input adds only its kept entries: adding +0.0 elsewhere would change nothing unless the
    accumulator holds -0.0 there, which ``negzero`` tracks per block (``_add_sparse``).
    """
    acc = {name: np.empty(layout.size(name), _F64) for name in layout.names}
    negzero = {name: [True] * len(range(0, layout.size(name), CHUNK)) for name in layout.names}
    tmp = np.empty(CHUNK, _F64)
    for index, source in enumerate(sources):
        factor = None if coefs is None else np.float64(coefs[index])
        sparse = isinstance(source, SparseSource)
        for name in layout.names:
            flags = negzero[name]
            for block, (start, stop) in enumerate(blocks(0, layout.size(name), CHUNK)):
                a = acc[name][start:stop]
                if sparse and (index == 0 or not flags[block]):
                    assert isinstance(source, SparseSource)
                    positions, values = await source.read_sparse(name, start, stop)
                    flags[block] = _add_sparse(a, positions, values, factor, index == 0)
                    continue
                x = await source.read(name, start, stop)
                t = _add_dense(a, x, factor, index == 0, tmp[: stop - start])
                if flags[block]:  # it stays possible only where this term is -0.0 too
                    flags[block] = _has_negzero(t)
    out = layout.empty()
    for name in layout.names:
        dst = out[name].reshape(-1)
        for start, stop in blocks(0, layout.size(name), CHUNK):
            with np.errstate(over="ignore", invalid="ignore"):
                round_into(dst[start:stop], acc[name][start:stop], divisor)
            if not np.isfinite(dst[start:stop]).all():
                raise NonFiniteResult(name)
        del acc[name]
    return out


def _add_dense(
    a: np.ndarray[Any, Any],
    x: np.ndarray[Any, Any],
    factor: np.float64 | None,
    first: bool,
    tmp: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    """Add ``factor * x`` to ``a`` (the first input: set ``a`` to it); the term added.

    Quietly: a NaN or overflow shows in the rounded output's check, and a signalling NaN
    would otherwise make NumPy warn when it is widened.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if first:
            if factor is None:
                np.copyto(a, x)
            else:
                np.multiply(x, factor, a)
            return a
        if factor is None:
            np.add(a, x, a, dtype=_F64)
            return x
        np.multiply(x, factor, tmp)
        np.add(a, tmp, a)
        return tmp


def _add_sparse(
    a: np.ndarray[Any, Any],
    positions: np.ndarray[Any, Any],
    values: np.ndarray[Any, Any],
    factor: np.float64 | None,
    first: bool,
) -> bool:
    """Add a sparse input's block to ``a`` (the first input: set ``a`` to it); whether ``a``
    may hold -0.0 afterwards.

    Called only when ``a`` holds no -0.0 (or for the first input), so ``a + 0.0`` is ``a``
    everywhere nothing is kept, and ``a + t`` can be -0.0 nowhere (that needs both -0.0).
    """
    terms = values if factor is None else np.multiply(values, factor)
    if first:
        a.fill(0.0)  # 0.0 * factor is +0.0: factors are never negative
        a[positions] = terms
        return _has_negzero(terms)  # a zero factor times a negative value
    a[positions] += terms
    return False


def _has_negzero(x: np.ndarray[Any, Any]) -> bool:
    """Whether ``x`` holds a -0.0."""
    zeros = x == 0
    return bool(zeros.any() and np.signbit(x[zeros]).any())


async def _gram(
    sources: Sequence[InputSource],
    layout: Layout,
    scales: Sequence[float] | None,
    itemsize: int,
    window_bytes: int,
) -> np.ndarray[Any, Any]:
    """Krum's Gram matrix, chunk by chunk in ``chunks(layout)`` order (the in-memory sums).

    A chunk is read in pieces of whole blocks, every input's piece together within
    ``window_bytes`` (one block each at least), and the pieces' products go into the chunk's
    own matrix in block order: the bits of reading it whole, without n chunks in memory.
    """
    n = len(sources)
    piece = max(BLOCK, window_bytes // max(1, n * itemsize) // BLOCK * BLOCK)
    gram = np.zeros((n, n), _F64)
    rows: np.ndarray[Any, Any] | None = None
    for name, start, stop in chunks(layout):
        width = row_width(stop - start)
        if rows is None or rows.shape[1] < width:
            rows = None  # dropped before the wider one is made
            rows = np.empty((n, width), _F64)
        part = np.zeros((n, n), _F64)
        for lo, hi in blocks(start, stop, piece):
            flats = await _read_all(sources, name, lo, hi)
            await asyncio.to_thread(chunk_gram, flats, name, 0, hi - lo, scales, rows, part)
            del flats
        gram += part
    return gram


async def _norm(source: InputSource, layout: Layout, rule: NormSum) -> float:
    """:func:`global_norm` of one input, read a chunk at a time (chunks are whole blocks)."""
    squares = SquareSum(rule)
    for name in sorted(layout.names):
        for start, stop in blocks(0, layout.size(name), CHUNK):
            squares.add(await source.read(name, start, stop))
    return squares.norm()
