"""A tree round's arithmetic (docs/spec.md, section 9.5) over the exact accumulator
(``_exact``, docs/spec.md section 6.4): which methods split (:func:`splittable`), a leaf's
coefficients (:func:`linear_terms`) and exact partial sums of its group's inputs as the
partial document holds them, and the root's combination of the groups' partials into the
round's output (:func:`aggregate_partials`), the same bits as the flat round accumulated
exactly (``accumulate = "exact"``), input and output clipping included.

A partial is, per tensor, a float64 array of shape ``(K, *shape)``: ``exact_partial``'s
``(K, size)`` rows, each element's canonical expansion of the exact sum of the group's
terms ``fl(c_i * x_i)`` (``c_i`` with the input's clip factor folded in), reshaped to the
tensor's shape so that a partial document says what it stands for. The root checks a
partial it did not compute (finite, float64, at most ``MAX_COMPONENTS`` rows, the layout's
shapes) before adding it: a leaf may be hostile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from ..errors import AggregationError
from ..format import Limits
from . import methods
from ._checks import Layout, NonFiniteResult, Tensors
from ._clip import clip_output_into, clip_then_round
from ._dispatch import AggregationInfo
from ._exact import MAX_COMPONENTS, exact_combine, exact_partial
from ._params import AggregationParams
from ._plans import linear_plan

Partial = dict[str, np.ndarray[Any, Any]]
"""A group's partial sums: per tensor name, a float64 array of shape (K, *shape)."""

_F64: Final = np.dtype(np.float64)


def partial_limits(limits: Limits) -> Limits:
    """The bounds a partial document is read within: an input's, with each element up to
    ``MAX_COMPONENTS`` float64 values and one more dimension (the components)."""
    return dataclasses.replace(
        limits,
        max_bytes=limits.max_bytes * 8 * MAX_COMPONENTS + limits.max_meta_bytes,
        max_elements=limits.max_elements * MAX_COMPONENTS,
        max_rank=limits.max_rank + 1,
    )


def splittable(params: AggregationParams) -> methods.Linear:
    """The method, if a round with ``params`` can be split into exact partial sums;
    AggregationError saying why not otherwise (median, trimmed_mean and Krum's selection
    are not sums of their groups' results; an ordered sum depends on the grouping)."""
    strategy = params.strategy
    if not isinstance(strategy, methods.Linear):
        raise AggregationError(
            f"{params.method} cannot be split into partial sums: only the linear methods "
            '(sum, mean, fedavg, weighted) can, with accumulate = "exact"'
        )
    if not strategy.exact:
        raise AggregationError(
            f'{params.method} splits into partial sums only with accumulate = "exact": '
            "the ordered binary64 sum depends on how the inputs are grouped"
        )
    return strategy


def linear_terms(
    params: AggregationParams,
    num_samples: Sequence[int],
    scales: Sequence[float] | None = None,
) -> tuple[list[float] | None, float | None]:
    """The coefficients ``c_i`` and divisor of a :func:`splittable` method over inputs with
    ``num_samples`` (in record order; ``params`` set up for those inputs, so ``weighted``
    holds their weights), input clipping's factors ``scales`` folded into the coefficients
    as the flat round folds them (docs/spec.md, sections 6.3-6.4); None: all ones."""
    strategy = splittable(params)
    n = len(num_samples)
    params.validate(n)
    return linear_plan(strategy.terms(n, num_samples), scales, n, {})


def as_document(rows: Mapping[str, np.ndarray[Any, Any]], layout: Layout) -> Partial:
    """``exact_partial``'s ``(K, size)`` rows as a partial document's ``(K, *shape)``."""
    return {
        name: rows[name].reshape((rows[name].shape[0], *layout.shapes[name]))
        for name in layout.names
    }


def partial_sums(
    flats: Sequence[Tensors], layout: Layout, coefs: Sequence[float] | None
) -> Partial:
    """A group's partial (``exact_partial``): per tensor, the expansion of
    ``sum_i fl(coefs[i] * x_i)`` of each element (``coefs`` None: all ones)."""
    if not flats:
        raise AggregationError("a partial needs at least one input")
    return as_document(exact_partial(flats, layout, coefs), layout)


def check_partial_tensors(
    tensors: Mapping[str, np.ndarray[Any, Any]], layout: Layout, what: str
) -> None:
    """AggregationError unless ``tensors`` is a partial of ``layout``: the same names, each
    float64 of shape (K, *shape) with 1 <= K <= MAX_COMPONENTS, every value finite."""
    if sorted(tensors) != sorted(layout.names):
        raise AggregationError(f"{what}: tensors {sorted(tensors)!r:.200} are not the round's")
    for name in layout.names:
        array = tensors[name]
        shape = layout.shapes[name]
        if array.dtype != _F64 or array.ndim != len(shape) + 1 or tuple(array.shape[1:]) != shape:
            raise AggregationError(
                f"{what}: tensor {name!r} is {array.dtype} {tuple(array.shape)}, not float64 "
                f"(K, {', '.join(map(str, shape))})"
            )
        if not 1 <= array.shape[0] <= MAX_COMPONENTS:
            raise AggregationError(
                f"{what}: tensor {name!r} has {array.shape[0]} components (1 to {MAX_COMPONENTS})"
            )
        if not np.isfinite(array).all():
            raise AggregationError(f"{what}: tensor {name!r} holds NaN or Inf")


def combine_partials(
    partials: Sequence[Mapping[str, np.ndarray[Any, Any]]],
    layout: Layout,
    divisor: float | None,
    threads: int = 1,
) -> dict[str, np.ndarray[Any, Any]]:
    """The groups' partials (``(K, *shape)`` or ``(K, size)``) combined by ``exact_combine``:
    every component of every partial summed exactly, rounded once to binary64, divided by
    ``divisor`` (None: not divided) and rounded to the layout's dtype (docs/spec.md,
    sections 6.4 and 9.5)."""
    if not partials:
        raise AggregationError("no partial to combine")
    rows = [
        {
            name: np.asarray(p[name]).reshape(np.shape(p[name])[0], layout.size(name))
            for name in layout.names
        }
        for p in partials
    ]
    return exact_combine(rows, layout, divisor, threads)


def aggregate_partials(
    partials: Sequence[Mapping[str, np.ndarray[Any, Any]]],
    layout: Layout,
    params: AggregationParams,
    num_samples: Sequence[int],
    *,
    threads: int = 1,
) -> tuple[dict[str, np.ndarray[Any, Any]], AggregationInfo]:
    """The root: the groups' partials of the round's inputs (``num_samples``: every
    input's, in record order; ``params`` the method over all of them) combined, divided by
    the method's divisor over every input, the output clipped and rounded once: the bits
    and :class:`AggregationInfo` ``aggregate_with_info`` gives over all the inputs (the
    info's input norms and scales are the leaves' to report). PartialSumError for a
    partial that cannot be combined, AggregationError otherwise."""
    n = len(num_samples)
    strategy = splittable(params)
    params.validate(n)
    info: dict[str, Any] = {}
    _, divisor = linear_plan(strategy.terms(n, num_samples), None, n, info)
    once = params.clip_output_norm is not None and params.output_clip == "float64"
    result = combine_partials(partials, layout.widened() if once else layout, divisor, threads)
    if params.clip_output_norm is not None:
        try:
            if once:
                wide, result = result, layout.empty()
                norm, scale = clip_then_round(
                    wide, result, params.clip_output_norm, params.method, params.norm_sum
                )
            else:
                norm, scale = clip_output_into(
                    result, params.clip_output_norm, params.method, params.norm_sum
                )
        except NonFiniteResult as exc:
            raise AggregationError(
                f"{params.method}: aggregating tensor {exc.name!r} overflows its dtype"
            ) from None
        info["output_norm"], info["output_scale"] = norm, scale
    return result, AggregationInfo(params.method, n, **info)
