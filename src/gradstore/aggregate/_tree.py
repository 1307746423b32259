"""A tree round's arithmetic (docs/spec.md, section 9.5): a leaf's exact partial sums of its
group's inputs, and the root's combination of the groups' partials into the round's output,
the same bits as the flat round accumulated exactly (``accumulate = "exact"``).

A partial is, per tensor, a float64 array of shape ``(K, *shape)``: a non-overlapping
expansion of the exact sum of the group's terms ``fl(c_i * x_i)`` (component 0 the exact
sum rounded to binary64, component 1 the rest rounded, ...), so the exact sum of every
group's components is the exact sum of every term, whatever the groups. The root checks a
partial it did not compute (finite, float64, at most ``MAX_COMPONENTS`` rows, the layout's
shapes) before adding it: a leaf may be hostile.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from ..errors import AggregationError
from ..format import Limits
from . import methods
from ._checks import Flat, Layout
from ._params import AggregationParams
from ._rounding import round_into

#: The most components a partial's expansion may have per element (a binary64 sum of any
#: number of binary64 terms needs at most 40: 2^1024 / 2^-1074 spans 2,098 bits).
MAX_COMPONENTS: Final = 40

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


def _expansion(terms: Sequence[float]) -> list[float]:
    """The exact sum of ``terms`` as non-overlapping binary64 components, largest first:
    each the rest of the exact sum, rounded once (``math.fsum``)."""
    values = list(terms)
    first = math.fsum(values)
    out = [first]
    while math.isfinite(out[-1]) and out[-1] != 0.0 and len(out) < MAX_COMPONENTS:
        values.append(-out[-1])
        rest = math.fsum(values)
        if rest == 0.0:
            break
        out.append(rest)
    if out[0] == 0.0:  # the spec's zero rule: -0.0 only when every term is -0.0
        out[0] = -0.0 if all(t == 0.0 and math.copysign(1.0, t) < 0 for t in terms) else 0.0
    return out


def partial_sums(flats: Sequence[Flat], layout: Layout, coefs: Sequence[float] | None) -> Partial:
    """A group's partial: per tensor, the expansion of ``sum_i fl(coefs[i] * x_i)`` of each
    element (``coefs`` None: all ones), padded to the tensor's largest K with -0.0 (which changes no sum, and keeps an
    all -0.0 element's sign through the root's combination)."""
    if not flats:
        raise AggregationError("a partial needs at least one input")
    out: Partial = {}
    for name in layout.names:
        size = layout.size(name)
        terms = np.empty((len(flats), size), _F64)
        for i, flat in enumerate(flats):
            x = np.asarray(flat[name], dtype=_F64).reshape(-1)
            if coefs is None:
                terms[i] = x
            else:
                np.multiply(x, np.float64(coefs[i]), terms[i])
        if not np.isfinite(terms).all():
            raise AggregationError(f"tensor {name!r}: an input or a product is not finite")
        columns = [_expansion(terms[:, j].tolist()) for j in range(size)]
        k = max((len(c) for c in columns), default=1)
        rows = np.full((k, size), -0.0, _F64)
        for j, comps in enumerate(columns):
            rows[: len(comps), j] = comps
        out[name] = rows.reshape((k, *layout.shapes[name]))
    return out


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
    """The round's output from the groups' checked partials: every component of every
    partial summed exactly, rounded once to binary64, divided by ``divisor`` (None: not
    divided) and rounded to the layout's dtype (docs/spec.md, sections 6.4 and 9.5)."""
    if not partials:
        raise AggregationError("no partial to combine")
    out = layout.empty()
    for name in layout.names:
        size = layout.size(name)
        rows = np.concatenate([np.asarray(p[name], _F64).reshape(-1, size) for p in partials])
        acc = np.empty(size, _F64)
        for j in range(size):
            column = rows[:, j].tolist()
            total = math.fsum(column)
            if total == 0.0 and all(v == 0.0 and math.copysign(1.0, v) < 0 for v in column):
                total = -0.0
            acc[j] = total
        dst = out[name].reshape(-1)
        round_into(dst, acc, divisor)
        if not np.isfinite(dst).all():
            raise AggregationError(f"tensor {name!r}: the combined output is not finite")
    return out
