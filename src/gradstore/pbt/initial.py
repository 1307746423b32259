"""Seeded initial hyperparameters for members the job file gives none.

Members draw in did order from ``Stream(stream_key("initial", seed, 0))`` (no run id is 7
characters long, so this stream is no interval's), each hyperparameter in name order: a list
takes ``values[below(len)]``, a range ``low + uniform() * (high - low)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ._rng import Stream, stream_key
from .space import Choice, HValue, PopulationParams

INITIAL_STREAM = "initial"


def initial_hparams(
    members: Iterable[str],
    params: PopulationParams,
    seed: int,
    given: Mapping[str, Mapping[str, HValue]] | None = None,
) -> dict[str, dict[str, HValue]]:
    """Every member's first hyperparameters: ``given``'s (checked) or drawn from the space."""
    given = given or {}
    rng = Stream(stream_key(INITIAL_STREAM, seed, 0))
    out: dict[str, dict[str, HValue]] = {}
    for member in sorted(members):
        drawn: dict[str, HValue] = {}
        for name, m in params.mutations.items():
            if isinstance(m, Choice):
                drawn[name] = m.values[rng.below(len(m.values))]
            else:
                drawn[name] = m.low + rng.uniform() * (m.high - m.low)
        mine = given.get(member)
        out[member] = drawn if mine is None else params.check_hparams(mine)
    return out
