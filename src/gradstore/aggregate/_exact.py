"""Exact accumulation for the linear methods: every element's terms summed exactly, rounded once.

``accumulate = "exact"`` (docs/spec.md, section 6.4): for each element,
``value = fl(fl_exact(sum_i fl(c_i * x_i)) / D)``, then the one rounding to the dtype.
The terms are the same binary64 products as in the ordered mode; their sum is computed
exactly (``_exact_kernel``: integer digits) and rounded once, to nearest with ties to
even, so the value does not depend on the order or the grouping of the inputs. An exact
zero is -0.0 only when every term is -0.0 (IEEE's rule for a sum); a sum beyond
binary64's range is infinite, refused as an overflow.

That makes a round splittable: a leaf publishes :func:`exact_partial` of its inputs, a
canonical expansion of its exact sum (at most ``MAX_COMPONENTS`` binary64 components per
element), and a root's :func:`exact_combine` of the leaves' partials gives the same bits
as :func:`combine_exact` over all the inputs, whatever the tree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Final

import numpy as np

from ..errors import AggregationError, PartialSumError
from ._blocks import Scratch, blocks, chunks, run
from ._checks import Flat, Layout, NonFiniteResult, Tensors, non_finite_error
from ._rounding import round_into

#: The most components a partial sum has per element. Each component after the first is
#: below half an ulp of the one before, so a finite binary64 sum (bits 2**-1074 to
#: 2**1023) never needs more than 40; a partial holding more is refused.
MAX_COMPONENTS: Final = 40

#: Elements per call of the expanding kernel: its (MAX_COMPONENTS, n) scratch is 20 MiB.
PARTIAL_CHUNK: Final = 1 << 16

#: Elements widened to binary64 at a time for dtypes the kernel does not read itself.
WIDEN_BLOCK: Final = 1 << 12

_F64: Final = np.dtype(np.float64)
_I64: Final = np.dtype(np.int64)
_READ: Final = (np.dtype(np.float32), _F64)
_NEG_ZERO_BITS: Final = np.int64(-(1 << 63))


def combine_exact(
    flats: Sequence[Flat],
    layout: Layout,
    coefs: Sequence[float] | None,
    divisor: float | None,
    threads: int,
) -> dict[str, np.ndarray[Any, Any]]:
    """``fl_exact(sum_i coefs[i] * x_i) / divisor`` per element, rounded to the layout's dtypes.

    ``coefs`` None means all ones; ``divisor`` None means no division. Raises
    NonFiniteResult if any output element is NaN/Inf (an input held one, or it overflowed).
    """
    kernel = _kernel()
    factors = _factors(coefs, len(flats))
    out = layout.empty()
    scratch = Scratch()

    def work(name: str, start: int, stop: int) -> None:
        bits = scratch.get("sums", (stop - start,), _I64)
        if _terms_into(
            kernel.sum_range, bits, [flat[name] for flat in flats], factors, start, stop
        ):
            raise NonFiniteResult(name)
        dst = out[name].reshape(-1)[start:stop]
        round_into(dst, bits.view(_F64), divisor)
        if not np.isfinite(dst).all():
            raise NonFiniteResult(name)

    run(work, chunks(layout), threads)
    return out


def exact_partial(
    inputs: Sequence[Tensors],
    layout: Layout,
    coefs: Sequence[float] | None,
    threads: int = 1,
) -> dict[str, np.ndarray[Any, Any]]:
    """Each tensor's exact sum ``sum_i fl(coefs[i] * x_i)``, as a float64 array of shape
    ``(K, size)``: a canonical expansion (docs/spec.md, section 6.4, "partial sums").

    Row 0 is the exact sum rounded once, row ``c`` what is left after rows ``0 .. c-1``,
    rounded once, until nothing is left; the rows an element does not need are +0.0, or
    -0.0 when every one of its terms was -0.0 (row 0 included). ``K >= 1`` is the largest
    count over the tensor's elements (at most MAX_COMPONENTS). ``inputs`` have
    ``layout`` (checked by the caller), in any order. Raises AggregationError for a NaN/Inf
    input or a sum beyond binary64's range.
    """
    kernel = _kernel()
    factors = _factors(coefs, len(inputs))
    flats = [{name: np.ravel(tensors[name]) for name in layout.names} for tensors in inputs]
    pieces: dict[tuple[str, int], np.ndarray[Any, Any]] = {}

    def work(name: str, start: int, stop: int) -> None:
        rows = np.empty((MAX_COMPONENTS, stop - start), _I64)
        count = _terms_into(
            kernel.expand_range, rows, [flat[name] for flat in flats], factors, start, stop
        )
        if count < 0:
            raise NonFiniteResult(name)
        pieces[name, start] = rows[: max(count, 1)].copy()

    try:
        run(work, chunks(layout, PARTIAL_CHUNK), threads)
    except NonFiniteResult as exc:
        raise non_finite_error(flats, layout, "exact partial", exc.name) from None
    return {
        name: join_pieces(
            [pieces[name, start] for start in range(0, layout.size(name), PARTIAL_CHUNK)],
            layout.size(name),
        )
        for name in layout.names
    }


def join_pieces(pieces: Sequence[np.ndarray[Any, Any]], size: int) -> np.ndarray[Any, Any]:
    """One tensor's partial from the partials of its consecutive ranges (``(K_j, n_j)``
    arrays, float64 or their int64 bits): ``(max K_j, size)`` float64, each piece's
    missing rows +0.0, or -0.0 where its row 0 is -0.0 (every term was)."""
    depth = max((len(piece) for piece in pieces), default=1)
    partial = np.empty((depth, size), _I64)
    start = 0
    for piece in pieces:
        part = piece.view(_I64)
        stop = start + part.shape[1]
        partial[: len(part), start:stop] = part
        pad = np.where(part[0] == _NEG_ZERO_BITS, _NEG_ZERO_BITS, np.int64(0))
        partial[len(part) :, start:stop] = pad
        start = stop
    if start != size:
        raise ValueError(f"pieces cover {start} elements, not {size}")
    return partial.view(_F64)


def exact_combine(
    partials: Sequence[Mapping[str, np.ndarray[Any, Any]]],
    layout: Layout,
    divisor: float | None,
    threads: int = 1,
) -> dict[str, np.ndarray[Any, Any]]:
    """The exact sum of every component of every partial (:func:`exact_partial`), divided
    by ``divisor`` and rounded once to the layout's dtypes: the same bits as
    :func:`combine_exact` over all the partials' inputs, however they were grouped.

    A partial comes from another process, perhaps a hostile one: each must hold exactly the
    layout's tensors, each a finite float64 array of shape ``(K, size)`` with
    ``1 <= K <= MAX_COMPONENTS`` (else PartialSumError, before any arithmetic). Its
    components need not be canonical: their exact sum is what counts. Raises
    AggregationError if the result overflows its dtype.
    """
    if not partials:
        raise AggregationError("exact combine: no partial sums to combine")
    rows = {name: _checked_rows(partials, layout, name) for name in layout.names}
    kernel = _kernel()
    scratch = Scratch()
    out = layout.empty()

    def work(name: str, start: int, stop: int) -> None:
        bits = scratch.get("sums", (stop - start,), _I64)
        ones = np.ones(len(rows[name]), np.float64)
        if _terms_into(kernel.sum_range, bits, rows[name], ones, start, stop):
            raise NonFiniteResult(name)  # only an overflow: the components are finite
        dst = out[name].reshape(-1)[start:stop]
        round_into(dst, bits.view(_F64), divisor)
        if not np.isfinite(dst).all():
            raise NonFiniteResult(name)

    try:
        run(work, chunks(layout), threads)
    except NonFiniteResult as exc:
        raise AggregationError(
            f"exact combine: aggregating tensor {exc.name!r} overflows its dtype"
        ) from None
    return out


def check_partial(
    partial: Mapping[str, np.ndarray[Any, Any]], layout: Layout, index: int = 0
) -> None:
    """Refuse (PartialSumError) a partial sum :func:`exact_combine` would refuse."""
    for name in layout.names:
        _checked_rows([partial], layout, name, index)


def _checked_rows(
    partials: Sequence[Mapping[str, np.ndarray[Any, Any]]],
    layout: Layout,
    name: str,
    first: int = 0,
) -> list[np.ndarray[Any, Any]]:
    """Every component row of tensor ``name`` over ``partials``, checked (PartialSumError)."""
    size = layout.size(name)
    out: list[np.ndarray[Any, Any]] = []
    for index, partial in enumerate(partials, start=first):
        if not isinstance(partial, Mapping) or set(partial) != set(layout.names):
            names = sorted(partial) if isinstance(partial, Mapping) else type(partial).__name__
            raise PartialSumError(index, f"holds {names}, not the tensors {list(layout.names)}")
        array = partial[name]
        if not isinstance(array, np.ndarray) or array.dtype.kind != "f" or array.itemsize != 8:
            raise PartialSumError(index, f"tensor {name!r} is not a float64 array")
        if array.ndim != 2 or array.shape[1] != size:
            raise PartialSumError(
                index, f"tensor {name!r} has shape {array.shape}, not (K, {size})"
            )
        if not 1 <= array.shape[0] <= MAX_COMPONENTS:
            raise PartialSumError(
                index,
                f"tensor {name!r} has {array.shape[0]} components, not 1 to {MAX_COMPONENTS}",
            )
        array = np.ascontiguousarray(array, _F64)  # native order, contiguous rows
        if not np.isfinite(array).all():
            raise PartialSumError(index, f"tensor {name!r} holds NaN or infinity")
        out.extend(array)
    _check_terms(len(out))
    return out


def _factors(coefs: Sequence[float] | None, n: int) -> np.ndarray[Any, Any]:
    """The coefficients as float64, one per input (ones for None); AggregationError else."""
    if n < 1:
        raise AggregationError("exact accumulation: no inputs")
    if coefs is not None and len(coefs) != n:
        raise AggregationError(f"exact accumulation: {len(coefs)} coefficients for {n} inputs")
    _check_terms(n)
    return np.array([1.0] * n if coefs is None else coefs, np.float64)


def _check_terms(count: int) -> None:
    from ._exact_kernel import MAX_TERMS

    if count > MAX_TERMS:
        raise AggregationError(
            f"exact accumulation sums at most {MAX_TERMS} terms per element, not {count}"
        )


def _terms_into(
    kernel: Any,
    dst: np.ndarray[Any, Any],
    arrays: Sequence[np.ndarray[Any, Any]],
    factors: np.ndarray[Any, Any],
    start: int,
    stop: int,
) -> int:
    """Run ``kernel`` over ``arrays[i][start:stop]`` times ``factors[i]``, into ``dst``
    (its last axis indexed from ``start``): ``sum_range``'s count of NaN/Inf sums, or
    ``expand_range``'s most components (-1: NaN/Inf).

    The kernel reads float32 and float64 arrays in place (all of one dtype, native,
    contiguous, aligned); others (float16, bfloat16, float8, a mix) are widened to float64
    a block at a time, which is exact."""
    expanding = dst.ndim == 2
    dtype = arrays[0].dtype
    if dtype in _READ and all(_readable(a, dtype) for a in arrays):
        addresses = np.array([a.ctypes.data for a in arrays], np.intp)
        like = np.empty(1, dtype)
        got = kernel(dst, like, arrays[0].size, addresses, factors, start, stop)
        return _checked(got, expanding)
    result = 0
    wide = np.empty((len(arrays), min(WIDEN_BLOCK, stop - start)), _F64)
    like = np.empty(1, _F64)
    for lo, hi in blocks(start, stop, WIDEN_BLOCK):
        rows = wide[:, : hi - lo]
        for row, array in zip(rows, arrays, strict=True):
            row[...] = array[lo:hi]
        addresses = np.array([row.ctypes.data for row in rows], np.intp)
        part = np.empty((*dst.shape[:-1], hi - lo), _I64)
        got = _checked(kernel(part, like, hi - lo, addresses, factors, 0, hi - lo), expanding)
        dst[..., lo - start : hi - start] = part
        if got < 0:
            return -1
        result = max(result, got) if expanding else result + got
    return result


def _checked(result: int, expanding: bool) -> int:
    """A kernel's result; an expansion longer than MAX_COMPONENTS cannot be finite."""
    return -1 if expanding and result > MAX_COMPONENTS else int(result)


def _readable(array: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> bool:
    return (
        array.dtype == dtype
        and array.dtype.isnative
        and array.flags.c_contiguous
        and array.flags.aligned
    )


def _kernel() -> ModuleType:
    """The exact kernel's module (compiled by numba on first use, when numba loads)."""
    from . import _exact_kernel

    return _exact_kernel
