"""``aggregate``: check, clip, run the method's kernel, clip the output, report what was done.

With output clipping (round/4), the kernel writes the float64 aggregate, whose norm sets the
scale; the scaled values are then rounded once to the dtype (``clip_then_round``).

Refusals happen before any arithmetic (parameters, layouts, dtypes, sample counts), except
NaN/Inf, which the kernels detect on the way (no separate pass over the inputs) and which
are then traced back to the input and tensor that hold them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from . import methods
from ._blocks import default_threads
from ._checks import (
    NonFiniteResult,
    Tensors,
    check_inputs,
    flatten,
    non_finite_error,
)
from ._clip import clip_output_into, clip_scale, clip_then_round, input_norms
from ._exact import combine_exact
from ._krum import krum_scores, squared_distances
from ._linear import combine
from ._params import AggregationParams
from ._plans import linear_plan, selection_plan
from ._robust import order_mean


@dataclass(frozen=True)
class AggregationInfo:
    """What an aggregation did, for the round record.

    ``weights``: each input's share of the aggregate, before any input clipping (1 for
    sum, 1/n for mean, num_samples / total for fedavg, w / sum(w) for weighted, 1/m for the
    inputs Krum selected and 0 for the others; None for the coordinate-wise median and
    trimmed_mean). The arithmetic multiplies by unnormalised coefficients and divides once
    (docs/spec.md, section 6.4). ``scores``/``selected``: Krum scores and the
    selected input indices. ``input_norms``/``input_scales``: with ``clip_input_norm``.
    ``output_norm``/``output_scale``: with ``clip_output_norm`` (the norm before clipping:
    of the float64 aggregate in round/4, of the rounded one in round/2 and round/3).
    """

    method: str
    n_inputs: int
    weights: tuple[float, ...] | None = None
    scores: tuple[float, ...] | None = None
    selected: tuple[int, ...] | None = None
    input_norms: tuple[float, ...] | None = None
    input_scales: tuple[float, ...] | None = None
    output_norm: float | None = None
    output_scale: float | None = None

    def to_record(self) -> dict[str, Any]:
        """The non-None fields, in field order, as plain JSON/CBOR values (tuples as lists)."""
        record: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                record[field.name] = list(value) if isinstance(value, tuple) else value
        return record


def aggregate(
    inputs: Sequence[Tensors],
    params: AggregationParams,
    num_samples: Sequence[int] | None = None,
    *,
    threads: int | None = None,
) -> dict[str, np.ndarray[Any, Any]]:
    """Combine ``inputs`` (in the order given) with ``params``; tensors in name order.

    Accumulates in float64 and writes the inputs' dtype; the result depends only on the
    inputs and their order (not on ``threads``). ``num_samples`` is used by fedavg only.
    Raises AggregationError when the inputs cannot be combined honestly.
    """
    return aggregate_with_info(inputs, params, num_samples, threads=threads)[0]


def aggregate_with_info(
    inputs: Sequence[Tensors],
    params: AggregationParams,
    num_samples: Sequence[int] | None = None,
    *,
    threads: int | None = None,
) -> tuple[dict[str, np.ndarray[Any, Any]], AggregationInfo]:
    """:func:`aggregate`, plus an :class:`AggregationInfo` (weights, Krum selection, norms)."""
    n, method, strategy = len(inputs), params.method, params.strategy
    params.validate(n)
    linear = (
        strategy.terms(n, num_samples) if isinstance(strategy, methods.Linear) else None
    )  # fedavg's sample counts are checked here, before any arithmetic
    layout = check_inputs(inputs, method)
    workers = default_threads() if threads is None else max(1, int(threads))
    info: dict[str, Any] = {}

    scales: list[float] | None = None
    if params.clip_input_norm is not None:
        norms = input_norms(inputs, params.norm_sum)
        scales = [clip_scale(norm, params.clip_input_norm) for norm in norms]
        info["input_norms"], info["input_scales"] = tuple(norms), tuple(scales)

    flats = flatten(inputs, layout)
    # clipped once (round/4): the method writes float64, the clip rounds to the dtype
    once = params.clip_output_norm is not None and params.output_clip == "float64"
    work = layout.widened() if once else layout
    try:
        if linear is not None:
            coefs, divisor = linear_plan(linear, scales, n, info)
            add = combine_exact if _exact(strategy) else combine
            result = add(flats, work, coefs, divisor, workers)
        elif isinstance(strategy, methods.OrderStatistic):
            first, stop = strategy.rows(n)
            result = order_mean(flats, work, first, stop, scales, workers)
        else:
            assert isinstance(strategy, methods.Selection)
            dist = squared_distances(flats, layout, scales, workers)
            scores = krum_scores(dist, strategy.f)
            selected, coefs, divisor = selection_plan(strategy, scores, scales, n, info)
            result = combine([flats[i] for i in selected], work, coefs, divisor, workers)
        if once:
            assert params.clip_output_norm is not None
            wide, result = result, layout.empty()
            info["output_norm"], info["output_scale"] = clip_then_round(
                wide,
                result,
                params.clip_output_norm,
                method,
                params.norm_sum,
                isinstance(strategy, methods.OrderStatistic),
            )
            del wide
    except NonFiniteResult as exc:
        raise non_finite_error(inputs, layout, method, exc.name) from None

    if params.clip_output_norm is not None and not once:
        norm, scale = clip_output_into(result, params.clip_output_norm, method, params.norm_sum)
        info["output_norm"], info["output_scale"] = norm, scale
    return result, AggregationInfo(method, n, **info)


def _exact(strategy: methods.Method) -> bool:
    """Whether a linear method sums its terms exactly (``accumulate = "exact"``)."""
    return isinstance(strategy, methods.Linear) and strategy.exact
