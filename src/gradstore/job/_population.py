"""A job's ``[population]`` section: population-based training over the job's peers.

[population]    members (default: every peer), intervals (decisions to make, >= 1),
                interval_steps (training steps per interval, >= 1), deadline_s (for a
                member's report; default rounds.deadline_s), seed (>= 0, default 0), and Ray
                Tune's knobs: quantile_fraction (0.25), resample_probability (0.25),
                perturbation_factors ([1.2, 0.8]), mode ("max": a higher score is better)
[population.hyperparam_mutations]   name = [values] (shift to a neighbour) or
                                    name = {low = .., high = ..} (a float range)
[population.initial]                "did:key:..." = {name = value, ...}; a member not
                                    listed draws its own from the space with the seed
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..pbt.initial import initial_hparams
from ..pbt.space import (
    DEFAULT_PERTURBATION_FACTORS,
    DEFAULT_QUANTILE_FRACTION,
    DEFAULT_RESAMPLE_PROBABILITY,
    Choice,
    HValue,
    PopulationParams,
    Range,
)
from ._aggregation import Where

_KEYS = {
    "members",
    "intervals",
    "interval_steps",
    "deadline_s",
    "seed",
    "quantile_fraction",
    "resample_probability",
    "perturbation_factors",
    "mode",
    "hyperparam_mutations",
    "initial",
}


@dataclass(frozen=True)
class PopulationConfig:
    """Who the members are, how long an interval is, and how each interval decides."""

    members: tuple[str, ...]
    intervals: int
    interval_steps: int
    deadline_s: float
    seed: int
    params: PopulationParams
    initial: Mapping[str, Mapping[str, HValue]]

    def first_hparams(self) -> dict[str, dict[str, HValue]]:
        """Every member's hyperparameters for interval 0 (given, or drawn with the seed)."""
        return initial_hparams(self.members, self.params, self.seed, self.initial)


def parse_population(
    raw: Any, where: Where, *, peers: Sequence[str], deadline_s: float
) -> PopulationConfig:
    """Validate ``[population]``; every problem is a ConfigError naming the key."""
    p = "population."
    where.keys(raw, _KEYS, p)
    members_raw = raw.get("members", list(peers))
    if not isinstance(members_raw, list) or not members_raw:
        raise where.err(p + "members", "must be a non-empty list of the job's peers")
    for i, m in enumerate(members_raw):
        if m not in peers:
            raise where.err(f"{p}members[{i}]", "is not one of the job's peers")
    if len(set(members_raw)) != len(members_raw):
        raise where.err(p + "members", "lists a member twice")
    members = tuple(sorted(members_raw))
    mutations_raw = raw.get("hyperparam_mutations")
    if not isinstance(mutations_raw, Mapping) or not mutations_raw:
        raise where.err(p + "hyperparam_mutations", "must be a table naming a hyperparameter")
    mutations: dict[str, Choice | Range] = {}
    for name, value in mutations_raw.items():
        key = f"{p}hyperparam_mutations.{name}"
        try:
            if isinstance(value, list):
                mutations[name] = Choice(tuple(value))
            else:
                where.keys(value, {"low", "high"}, key + ".")
                mutations[name] = Range(
                    where.num(value.get("low"), key + ".low"),
                    where.num(value.get("high"), key + ".high"),
                )
        except ValueError as exc:
            raise where.err(key, str(exc)) from None
    factors = raw.get("perturbation_factors", list(DEFAULT_PERTURBATION_FACTORS))
    if not isinstance(factors, list):
        raise where.err(p + "perturbation_factors", "must be a list of numbers")
    try:
        params = PopulationParams(
            mutations,
            quantile_fraction=where.num(
                raw.get("quantile_fraction", DEFAULT_QUANTILE_FRACTION), p + "quantile_fraction"
            ),
            resample_probability=where.num(
                raw.get("resample_probability", DEFAULT_RESAMPLE_PROBABILITY),
                p + "resample_probability",
            ),
            perturbation_factors=tuple(
                where.num(f, f"{p}perturbation_factors[{i}]") for i, f in enumerate(factors)
            ),
            mode=raw.get("mode", "max"),
        )
    except ValueError as exc:
        raise where.err(p.rstrip("."), str(exc)) from None
    initial_raw = raw.get("initial", {})
    if not isinstance(initial_raw, Mapping):
        raise where.err(p + "initial", "must be a table of members")
    initial: dict[str, dict[str, HValue]] = {}
    for member, hparams in initial_raw.items():
        key = f'{p}initial."{member}"'
        if member not in members:
            raise where.err(key, "is not a member of the population")
        if not isinstance(hparams, Mapping):
            raise where.err(key, "must be a table of hyperparameters")
        try:
            initial[member] = params.check_hparams(hparams)
        except ValueError as exc:
            raise where.err(key, str(exc)) from None
    return PopulationConfig(
        members=members,
        intervals=where.int_(raw.get("intervals", 1), p + "intervals", 1),
        interval_steps=where.int_(raw.get("interval_steps", 1), p + "interval_steps", 1),
        deadline_s=where.num(raw.get("deadline_s", deadline_s), p + "deadline_s", positive=True),
        seed=where.int_(raw.get("seed", 0), p + "seed", 0),
        params=params,
        initial=initial,
    )
