"""A tree's two ends for the linear methods with ``accumulate = "exact"``: a leaf's
coefficients for its group, and a root's aggregate from the leaves' partial sums.

A leaf sums its group's terms exactly (``exact_partial`` or ``exact_partial_streamed``,
with :func:`group_coefficients`); the root combines every leaf's partial sum, divides
once, clips the output and rounds once (:func:`aggregate_partials`), exactly as
:func:`aggregate_with_info` over all the round's inputs in record order would: the same
bits, so the tree's output CID is the flat round's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import AggregationError
from . import methods
from ._checks import Layout, NonFiniteResult
from ._clip import clip_output_into, clip_then_round
from ._dispatch import AggregationInfo
from ._exact import exact_combine
from ._params import AggregationParams
from ._plans import linear_plan


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


def group_coefficients(
    params: AggregationParams,
    n: int,
    num_samples: Sequence[int] | None = None,
    scales: Sequence[float] | None = None,
) -> list[float] | None:
    """A leaf's coefficients for its group's ``n`` inputs (in the group's order): the
    method's ``c_i``, input clipping's factors folded in (docs/spec.md, sections 6.3-6.4);
    None for all ones.

    ``params`` are the method set up for the group (``Method.for_round`` with the group's
    peers, so ``weighted`` holds their weights); ``num_samples`` the group's (fedavg);
    ``scales`` each input's clip factor (``clip_scale``) when the job clips inputs."""
    strategy = splittable(params)
    params.validate(n)
    coefs, _ = linear_plan(strategy.terms(n, num_samples), scales, n, {})
    return coefs


def aggregate_partials(
    partials: Sequence[Mapping[str, np.ndarray[Any, Any]]],
    layout: Layout,
    params: AggregationParams,
    n: int,
    num_samples: Sequence[int] | None = None,
    *,
    threads: int = 1,
) -> tuple[dict[str, np.ndarray[Any, Any]], AggregationInfo]:
    """The root: the leaves' partial sums (``exact_partial``) of the round's ``n`` inputs
    combined into the aggregate and its :class:`AggregationInfo`, the bits
    ``aggregate_with_info`` gives over all the inputs.

    ``params`` are the method for the whole round (``weighted``: every input's weight, in
    record order); ``num_samples`` every input's (fedavg). The info's ``weights`` are
    every input's share; input norms and scales are the leaves' to report. Raises
    PartialSumError for a partial that cannot be combined, AggregationError otherwise."""
    strategy = splittable(params)
    params.validate(n)
    info: dict[str, Any] = {}
    _, divisor = linear_plan(strategy.terms(n, num_samples), None, n, info)
    once = params.clip_output_norm is not None and params.output_clip == "float64"
    work = layout.widened() if once else layout
    result = exact_combine(partials, work, divisor, threads)
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
