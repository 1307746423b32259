"""Explore: perturb or resample a copied member's hyperparameters (Ray Tune's semantics).

For each hyperparameter in name order, one ``uniform()`` draw decides: below
``resample_probability`` (or, for a list, whenever the value is not in it) the value is
resampled, else perturbed. A list resamples with ``below(len)`` and shifts with ``below(2)``
(0: one place left, 1: one place right, clamped at the ends); a range resamples
``low + uniform() * (high - low)`` and perturbs by ``factors[below(len(factors))]``.
Only correctly rounded float64 operations are used, so the result is the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._rng import Stream
from .space import Choice, HValue, PopulationParams


def explore(
    hparams: Mapping[str, HValue], params: PopulationParams, rng: Stream
) -> dict[str, HValue]:
    """The explored copy of ``hparams`` (checked against ``params``), drawing from ``rng``."""
    current = params.check_hparams(hparams)
    out: dict[str, HValue] = {}
    for name, mutation in params.mutations.items():
        value = current[name]
        resample = rng.uniform() < params.resample_probability
        if isinstance(mutation, Choice):
            index = mutation.index(value)
            if resample or index is None:
                out[name] = mutation.values[rng.below(len(mutation.values))]
            else:
                shift = -1 if rng.below(2) == 0 else 1
                out[name] = mutation.values[min(max(index + shift, 0), len(mutation.values) - 1)]
        elif resample:
            out[name] = mutation.low + rng.uniform() * (mutation.high - mutation.low)
        else:
            factors = params.perturbation_factors
            assert isinstance(value, float)  # check_hparams: a range's value is a float
            out[name] = value * factors[rng.below(len(factors))]
    return out
