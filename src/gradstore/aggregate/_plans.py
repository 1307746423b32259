"""What a linear or a selecting method will compute, worked out once for both engines.

The in-memory engine (``_dispatch``) and the streamed one (``_streamed``) run the same
arithmetic over differently held inputs; the coefficients they pass to their kernels, and
what the round record says each input was multiplied by, come from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import methods
from ._krum import select_lowest


def linear_plan(
    terms: tuple[list[float] | None, float | None],
    scales: Sequence[float] | None,
    n: int,
    info: dict[str, Any],
) -> tuple[list[float] | None, float | None]:
    """Coefficients (input clipping folded in) and divisor; ``info["weights"]`` recorded."""
    coefs, divisor = terms
    info["weights"] = tuple(c / (divisor or 1.0) for c in coefs or [1.0] * n)
    if scales is not None:
        coefs = [s if coefs is None else coefs[i] * s for i, s in enumerate(scales)]
    return coefs, divisor


def selection_plan(
    strategy: methods.Selection,
    scores: Sequence[float],
    scales: Sequence[float] | None,
    n: int,
    info: dict[str, Any],
) -> tuple[tuple[int, ...], list[float] | None, float | None]:
    """Krum's selected inputs, their coefficients and divisor; scores and weights recorded."""
    m = strategy.chosen(n)
    selected = select_lowest(scores, m)
    coefs = None if scales is None else [scales[i] for i in selected]
    info["scores"], info["selected"] = tuple(scores), selected
    chosen = set(selected)  # not the tuple: n x m comparisons
    info["weights"] = tuple(1.0 / m if i in chosen else 0.0 for i in range(n))
    return selected, coefs, None if m == 1 else float(m)
