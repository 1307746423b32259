"""Where a round stands for a peer that waits on it, from its coordinator's signed statuses:
pure, no I/O.

A waiting peer used to say nothing for as long as 15 s while its coordinator's own terminal
showed ``1/2 verified ... deadline in 29 s`` (issue 24). The statuses every peer hears say as
much: who is verified (a bitmap), and, once the round's clock runs, when its deadline falls
(``Status.deadline``); the quorum and the peers expected are the job file's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..job import JobConfig
from ._view import CoordinatorView


@dataclass(frozen=True)
class RoundWait:
    """A round (or one step of it) as its latest fresh statuses tell it. A stepped round
    awaited whole (``step`` None) sums its steps' counts and quorums, and its deadline is the
    next one of a step still open, as the coordinator's own "waiting for peers" line does."""

    round: int
    step: str | None
    verified: int
    received: int
    expected: int
    quorum: int
    deadline_ms: int | None  # unix ms on the coordinator's clock; None: its clock has not begun
    steps: int = 0  # a stepped round awaited whole: its steps (0 otherwise)
    steps_ended: int = 0  # of those, the ones that closed or failed

    def counts(self, now_ms: int) -> str:
        """``1/2 verified, quorum 2, deadline in 29 s`` (``now_ms``: this machine's unix ms)."""
        clock = (
            "the deadline starts at the first announcement"
            if self.deadline_ms is None
            else f"deadline in {max(0, self.deadline_ms - now_ms) / 1000:.0f} s"
        )
        steps = f"steps {self.steps_ended}/{self.steps} ended; " if self.steps else ""
        return (
            f"{steps}{self.verified}/{self.expected} verified, {self.received} received, "
            f"quorum {self.quorum}, {clock}"
        )


def round_wait(
    view: CoordinatorView, config: JobConfig, round_: int, step: str | None, since_ms: int
) -> RoundWait | None:
    """``round_`` (its ``step``) as the current run's statuses stamped since ``since_ms`` say,
    or None when none has been heard of it yet."""
    run = view.current
    if run is None:
        return None
    names = [s.name for s in config.steps] if config.stepped else [None]
    wanted = names if step is None else [step]
    found = [(name, view.round_view(round_, name, since_ms)) for name in wanted]
    heard = [(name, v) for name, v in found if v is not None and v.lists is not None]
    if not heard:
        return None
    by_name = {s.name if config.stepped else None: s for s in config.steps}
    verified = received = 0
    for _, v in heard:
        assert v.lists is not None
        verified += len(view.roster.members(v.lists.verified))
        received += len(view.roster.members(v.lists.received))
    ended = [v is not None and (v.result is not None or v.failed is not None) for _, v in found]
    deadlines = [
        v.deadline
        for (_, v), over in zip(found, ended, strict=True)
        if v is not None and v.deadline is not None and not over
    ]
    return RoundWait(
        round=round_,
        step=step,
        verified=verified,
        received=received,
        expected=sum(len(by_name[name].peers) for name in wanted),
        quorum=sum(by_name[name].quorum for name in wanted),
        deadline_ms=min(deadlines) if deadlines else None,
        steps=len(names) if step is None and config.stepped else 0,
        steps_ended=sum(ended) if step is None and config.stepped else 0,
    )
