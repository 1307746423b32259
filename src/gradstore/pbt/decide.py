"""One interval's decision: rank the members that reported, let the bottom quantile (and
every failed member) copy a top-quantile member's checkpoint, and explore the copied
hyperparameters. Pure: the same inputs give the same decision on every machine.

Ranking (Ray Tune's ``_quantiles``): members sorted ascending by score (negated in mode
``min``), ties broken by did (the smaller did ranks lower); ``n = ceil(count *
quantile_fraction)``, at most ``floor(count / 2)``, and no quantiles with fewer than 2 members.
The bottom ``n`` are exploited by the top ``n``. Failed members are refilled the same way,
from the top ``n`` or, when ``n`` is 0, from the best member. Targets draw in did order: a
source ``top[below(len(top))]``, then the explored hyperparameters (``explore``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..dag.cid import CID
from ._rng import Stream, stream_key
from .explore import explore
from .space import HValue, PopulationParams


@dataclass(frozen=True)
class MemberScore:
    """What a member reported for an interval: its checkpoint, score and hyperparameters."""

    member: str
    checkpoint: CID
    score: float
    hparams: dict[str, HValue]


@dataclass(frozen=True)
class MemberFailure:
    """A member left out of the ranking: it never reported, or its checkpoint did not verify."""

    member: str
    reason: str
    checkpoint: str | None = None


@dataclass(frozen=True)
class Copy:
    """Exploit + explore for one member: continue from ``source``'s checkpoint with ``hparams``."""

    member: str
    source: str
    checkpoint: CID
    hparams: dict[str, HValue]


@dataclass(frozen=True)
class Decision:
    """The members ranked worst to best, and the copies made (sorted by member)."""

    ranking: tuple[str, ...]
    bottom: tuple[str, ...]
    top: tuple[str, ...]
    copies: tuple[Copy, ...]

    def copy_for(self, member: str) -> Copy | None:
        """The copy ``member`` makes this interval, if any."""
        return next((c for c in self.copies if c.member == member), None)


def quantile_size(count: int, fraction: float) -> int:
    """How many members are in each quantile: ``ceil(count * fraction)``, at most half."""
    if count <= 1:
        return 0
    n = math.ceil(count * fraction)
    return min(n, count // 2)


def decide(
    scores: Sequence[MemberScore],
    failures: Sequence[MemberFailure],
    params: PopulationParams,
    *,
    run: str,
    seed: int,
    interval: int,
) -> Decision:
    """The decision for ``interval`` from the members' ``scores`` and ``failures``, drawing
    from the stream of (``run``, ``seed``, ``interval``). A member may appear once only."""
    members = [s.member for s in scores] + [f.member for f in failures]
    if len(set(members)) != len(members):
        raise ValueError("a member is listed twice among the scores and failures")
    for s in scores:
        if not math.isfinite(s.score):
            raise ValueError(f"{s.member}'s score {s.score!r} is not finite")
    sign = 1.0 if params.mode == "max" else -1.0
    ranked = sorted(scores, key=lambda s: (sign * s.score, s.member))
    n = quantile_size(len(ranked), params.quantile_fraction)
    bottom = ranked[:n]
    top = ranked[len(ranked) - n :] if n else ranked[-1:]
    targets = sorted([s.member for s in bottom] + [f.member for f in failures])
    rng = Stream(stream_key(run, seed, interval))
    copies: list[Copy] = []
    if top:
        for member in targets:
            source = top[rng.below(len(top))]
            hparams = explore(source.hparams, params, rng)
            copies.append(Copy(member, source.member, source.checkpoint, hparams))
    return Decision(
        ranking=tuple(s.member for s in ranked),
        bottom=tuple(s.member for s in bottom),
        top=tuple(s.member for s in top) if n else (),
        copies=tuple(copies),
    )
