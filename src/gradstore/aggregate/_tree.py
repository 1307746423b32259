"""A tree round's arithmetic (docs/spec.md, section 9.5) over the exact accumulator
(``_exact``, docs/spec.md section 6.4): a leaf's exact partial sums of its group's inputs as
the partial document holds them, and the root's combination of the groups' partials into
the round's output, the same bits as the flat round accumulated exactly
(``accumulate = "exact"``).

A partial is, per tensor, a float64 array of shape ``(K, *shape)``: ``exact_partial``'s
``(K, size)`` rows, each element's canonical expansion of the exact sum of the group's
terms ``fl(c_i * x_i)``, reshaped to the tensor's shape so that a partial document says
what it stands for. The root checks a partial it did not compute (finite, float64, at most
``MAX_COMPONENTS`` rows, the layout's shapes) before adding it: a leaf may be hostile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from ..errors import AggregationError
from ..format import Limits
from . import methods
from ._checks import Layout, Tensors
from ._exact import MAX_COMPONENTS, exact_combine, exact_partial
from ._params import AggregationParams

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


def linear_terms(
    params: AggregationParams, num_samples: Sequence[int]
) -> tuple[list[float] | None, float | None]:
    """The coefficients and divisor of a linear method over inputs with ``num_samples`` (in
    record order); AggregationError for a method that cannot be split into partial sums."""
    strategy = params.strategy
    if not isinstance(strategy, methods.Linear):
        raise AggregationError(f"{params.method} is not linear: it has no partial sums")
    n = len(num_samples)
    params.validate(n)
    return strategy.terms(n, num_samples)


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
    partials: Sequence[Mapping[str, np.ndarray[Any, Any]]], layout: Layout, divisor: float | None
) -> dict[str, np.ndarray[Any, Any]]:
    """The round's output from the groups' partials (``exact_combine``): every component of
    every partial summed exactly, rounded once to binary64, divided by ``divisor`` (None:
    not divided) and rounded to the layout's dtype (docs/spec.md, sections 6.4 and 9.5)."""
    if not partials:
        raise AggregationError("no partial to combine")
    rows = [
        {
            name: np.asarray(p[name]).reshape(np.shape(p[name])[0], layout.size(name))
            for name in layout.names
        }
        for p in partials
    ]
    return exact_combine(rows, layout, divisor)
