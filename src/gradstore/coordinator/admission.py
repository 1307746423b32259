"""Admission of one announcement: a pure decision from the message and the state, with a reason.

The signature, the job and the allowlist are checked when the message is decoded
(``messages.verify_message``); what is left needs the coordinator's state: the run, the
clock, the open round and what each peer already announced. The coordinator's state
(``CoordinatorState.admit``, given each message the service reads) calls ``admit`` and
turns the answer into effects, so every hostile sequence can be tested here without a
network.

Which refusals are told to the peer (``Admission.tell``): only those about an announcement
the peer may still stand behind. A message of another run or stamped outside the skew
window is most likely a replay by someone else, so the peer is not told about it (a peer
whose own clock is wrong notices from the coordinator's messages, which it refuses too).
A round far behind or far ahead is not told either: each told refusal costs a status
message for its round, and a peer naming thousands of different rounds must not buy
thousands of publishes.

Steps (a stepped job, ``[[steps]]``): every announcement names one of the job's steps,
and its peer must be one of that step's peers (``unknown-step``, ``not-in-step``); a job
without steps refuses an announcement that names one. Both are told in the status of the
step the announcement named (a peer whose job file is not the coordinator's hears why);
the state tells only a few step names the job does not have per round, so naming
thousands does not buy thousands of publishes. Duplicates are per (round, step, peer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from ..errors import Reason, reason_text
from ..messages import Announce


class Verdict(StrEnum):
    ACCEPT = "accept"  # journal it, then fetch and verify it
    DUPLICATE = "duplicate"  # already have exactly this: no work, no publish
    REFUSE = "refuse"
    IGNORE = "ignore"  # for a step another coordinator owns: its owner answers it


@dataclass(frozen=True, slots=True)
class Admission:
    """What to do with one announcement, and why."""

    verdict: Verdict
    reason: Reason | None = None  # its code: stale-round, conflicting-cid, ... (None: accepted)
    detail: str = ""  # one line for logs and for the peer
    tell: bool = False  # whether the peer hears of the refusal (in its round's status)

    @property
    def text(self) -> str:
        """``"reason: detail"``, what logs and statuses carry."""
        return "" if self.reason is None else reason_text(self.reason, self.detail)


ACCEPT = Admission(Verdict.ACCEPT)

#: Rounds this far behind the open one (or beyond the allowed lead) still hear their refusal.
TELL_WINDOW: Final = 2


@dataclass(frozen=True, slots=True)
class AdmissionState:
    """What admission needs to know of the coordinator."""

    run: str
    open_round: int
    max_ahead: int
    max_skew_ms: int
    #: (round, peer), with the step in a stepped job (``steps.input_key``) -> the CID announced
    announced: Mapping[tuple[int, str] | tuple[int, str, str], str]
    #: each step's peers in a stepped job; None: the job has no steps
    steps: Mapping[str, frozenset[str]] | None = field(default=None)


def admit(ann: Announce, state: AdmissionState, now_ms: int) -> Admission:
    """Accept, ignore as a duplicate, or refuse (with a reason) one verified announcement."""
    if ann.run != state.run:
        return Admission(
            Verdict.REFUSE,
            Reason.WRONG_RUN,
            f"announcement is for run {ann.run}, this is {state.run}",
        )
    skew = ann.sent_at - now_ms
    if abs(skew) > state.max_skew_ms:
        return Admission(
            Verdict.REFUSE,
            Reason.CLOCK_SKEW,
            f"stamped {skew / 1000:+.1f} s from the coordinator's clock "
            f"(the job allows {state.max_skew_ms / 1000:.0f} s)",
        )
    r, open_ = ann.round, state.open_round
    refused = _step_refusal(ann, state.steps)
    if refused is not None:  # told only for a round whose refusals are told
        near = open_ - TELL_WINDOW <= r <= open_ + state.max_ahead + TELL_WINDOW
        return Admission(refused.verdict, refused.reason, refused.detail, refused.tell and near)
    if r < open_:
        return Admission(
            Verdict.REFUSE,
            Reason.STALE_ROUND,
            f"round {r} is over (round {open_} is open)",
            tell=r >= open_ - TELL_WINDOW,
        )
    if r > open_ + state.max_ahead:
        return Admission(
            Verdict.REFUSE,
            Reason.FUTURE_ROUND,
            f"round {r} is too far ahead (round {open_} is open, {state.max_ahead} ahead allowed)",
            tell=r <= open_ + state.max_ahead + TELL_WINDOW,
        )
    known = state.announced.get((r, ann.peer) if ann.step is None else (r, ann.peer, ann.step))
    if known is not None:
        if known == ann.cid:
            return Admission(Verdict.DUPLICATE, Reason.DUPLICATE)
        return Admission(
            Verdict.REFUSE,
            Reason.CONFLICTING_CID,
            f"round {r}: already announced {known}, the first announcement counts",
            tell=True,
        )
    return ACCEPT


def _step_refusal(ann: Announce, steps: Mapping[str, frozenset[str]] | None) -> Admission | None:
    """Why ``ann`` cannot be for a step of this job (None: it can): checked before the
    round, so every refusal told in a step's status is of a step the job has."""
    if steps is None:
        if ann.step is None:
            return None
        return Admission(
            Verdict.REFUSE,
            Reason.UNKNOWN_STEP,
            f"names step {ann.step!r}; the job has no steps",
            tell=True,
        )
    if ann.step is None or ann.step not in steps:
        named = "names no step" if ann.step is None else f"names step {ann.step!r}"
        listed = ", ".join(list(steps)[:8]) + (", ..." if len(steps) > 8 else "")
        return Admission(
            Verdict.REFUSE, Reason.UNKNOWN_STEP, f"{named}; the job's steps: {listed}", tell=True
        )
    if ann.peer not in steps[ann.step]:
        return Admission(
            Verdict.REFUSE,
            Reason.NOT_IN_STEP,
            f"{ann.peer} is not one of step {ann.step!r}'s peers",
            tell=True,
        )
    return None
