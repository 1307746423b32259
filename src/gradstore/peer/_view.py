"""What a peer has heard from its coordinator, and what it means for a round: pure, no I/O.

The coordinator's statuses and results arrive signed, but pubsub may deliver them late,
twice, or replayed by anyone, including messages of an earlier run of the same job. So a
peer keeps them per run, follows the run whose messages are the most recent (every
message it keeps was stamped within the job's clock-skew window), and answers questions
about one round of that run from messages stamped after a given time (``since_ms``: when
it announced, or began to wait): a replayed message was stamped before, and cannot
acknowledge an announcement or stand for a result. The live coordinator re-sends what
matters with fresh stamps, so waiting for a fresh one costs at most one re-broadcast.

In a stepped job (``[[steps]]``) each step of a round has its own statuses and result,
kept apart by ``(round, step)``; the round's own result and failure have step None. A
message naming a step the job does not have is not for this job's peers (``knows``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from ..messages import PeerLists, Result, Roster, Status

#: Where one round's messages are kept: (round, step), step None for the round itself.
Slot = tuple[int, str | None]


class Standing(Enum):
    """Where one peer's input for one round stands, as far as the coordinator has said."""

    UNKNOWN = "unknown"  # not heard of yet: keep announcing
    RECEIVED = "received"  # journaled: stop announcing, it is being verified
    VERIFIED = "verified"  # verified (or aggregated): done
    REFUSED = "refused"  # refused or excluded, with a reason
    FAILED = "failed"  # the round failed: no aggregate will come, so nothing to wait for
    OVER = "over"  # the round ended without it (its result may still be on its way)


@dataclass
class RoundView:
    """One round (or one step of a round) of one run: the latest status lists, and its
    result or failure; ``heard`` orders the slots by when their outcome was first heard."""

    lists: PeerLists | None = None
    status_sent_at: int = -1
    deadline: int | None = None  # the latest status's: when the round's deadline falls (unix ms)
    result: Result | None = None
    result_peers: bytes = b""
    result_sent_at: int = -1
    failed: str | None = None
    failed_sent_at: int = -1
    heard: int = -1


@dataclass(frozen=True)
class Outcome:
    """A round's (or a step's) result with its peers, or why it failed, or neither yet.
    Read from a round/5 record (a step's result missed), it has who was excluded and why."""

    result: Result | None = None
    peers: bytes = b""
    failed: str | None = None
    excluded: tuple[tuple[str, str], ...] = ()

    @property
    def known(self) -> bool:
        """Whether the coordinator said how it ended."""
        return self.result is not None or self.failed is not None


@dataclass
class RunView:
    """Everything heard about one run of the job."""

    run: str
    last_sent_at: int = 0
    open_round: int = 0
    rounds: dict[Slot, RoundView] = field(default_factory=dict)

    def round(self, r: int, step: str | None = None) -> RoundView:
        view = self.rounds.get((r, step))
        if view is None:
            view = self.rounds[(r, step)] = RoundView()
        return view


class CoordinatorView:
    """The runs heard of, and the current one: the run of the most recent message.

    ``steps`` are a stepped job's step names in the job's order (empty: a job without steps).
    """

    def __init__(self, roster: Roster, steps: Iterable[str] = ()) -> None:
        self.roster = roster
        self.steps = tuple(steps)
        self._step_names = frozenset(self.steps)
        self.runs: dict[str, RunView] = {}
        self.current: RunView | None = None
        self._heard = itertools.count()

    @property
    def open_round(self) -> int:
        """The current run's open round, as far as heard (-1: no run heard yet)."""
        return -1 if self.current is None else self.current.open_round

    def knows(self, step: str | None) -> bool:
        """Whether a message about ``step`` can be this job's: the round's own (None), or a
        step of a stepped job. Anything else is ignored, whoever signed it."""
        return step is None or step in self._step_names

    def _run(self, run: str, sent_at: int) -> RunView:
        view = self.runs.get(run)
        if view is None:
            view = self.runs[run] = RunView(run)
        view.last_sent_at = max(view.last_sent_at, sent_at)
        if self.current is None or view.last_sent_at > self.current.last_sent_at:
            self.current = view
        return view

    def see_status(self, status: Status, lists: PeerLists) -> None:
        """Record a verified, fresh status whose lists are ``lists`` (inline or fetched);
        one about a step the job does not have is ignored."""
        if not self.knows(status.step):
            return
        run = self._run(status.run, status.sent_at)
        view = run.round(status.round, status.step)
        if status.failed is not None:
            view.failed = status.failed
            view.failed_sent_at = max(view.failed_sent_at, status.sent_at)
            if view.heard < 0:
                view.heard = next(self._heard)
        else:
            run.open_round = max(run.open_round, status.round)
        if status.sent_at >= view.status_sent_at:
            view.lists, view.status_sent_at = lists, status.sent_at
            view.deadline = status.deadline

    def see_result(self, result: Result, lists: PeerLists) -> None:
        """Record a verified, fresh result whose peer bitmap is in ``lists``; one about a
        step the job does not have is ignored. A step's result leaves the round open."""
        if not self.knows(result.step):
            return
        run = self._run(result.run, result.sent_at)
        view = run.round(result.round, result.step)
        if view.result is None:
            view.result, view.result_peers = result, lists.peers
            if view.heard < 0:
                view.heard = next(self._heard)
        view.result_sent_at = max(view.result_sent_at, result.sent_at)
        if result.step is None:
            run.open_round = max(run.open_round, result.round + 1)

    def slot(self, round_: int, step: str | None = None, since_ms: int = 0) -> RoundView | None:
        """What the current run said of ``round_`` (or of its ``step``) in messages stamped
        at ``since_ms`` or later; None when it said nothing (``gradstore round status``)."""
        return self._fresh(round_, step, since_ms)

    def _fresh(self, round_: int, step: str | None, since_ms: int) -> RoundView | None:
        """The current run's view of ``(round_, step)``, without what was stamped before
        ``since_ms``; None when there is no such view."""
        run = self.current
        view = None if run is None else run.rounds.get((round_, step))
        return None if view is None else _since(view, since_ms)

    def round_view(self, round_: int, step: str | None, since_ms: int = 0) -> RoundView | None:
        """What the current run said of ``round_`` (its ``step``) in messages stamped at
        ``since_ms`` or later (None: nothing)."""
        return self._fresh(round_, step, since_ms)

    def standing(
        self, round_: int, peer: str, since_ms: int = 0, step: str | None = None
    ) -> tuple[Standing, str | None]:
        """Where ``peer``'s input for ``round_`` (to ``step`` of a stepped job) of the current
        run stands, with a reason, from messages stamped at ``since_ms`` or later."""
        run = self.current
        if run is None or run.last_sent_at < since_ms:
            return Standing.UNKNOWN, None
        what = f"round {round_}" if step is None else f"step {step!r} of round {round_}"
        view = self._fresh(round_, step, since_ms)
        if view is not None:
            if view.result is not None:
                if self.roster.has(view.result_peers, peer):
                    return Standing.VERIFIED, None
                reason = self.refusal(view, peer)
                if reason is not None:
                    return Standing.REFUSED, reason
                return Standing.OVER, f"{what} closed without this peer's input"
            reason = self.refusal(view, peer)
            if reason is not None:
                return Standing.REFUSED, reason
            if view.failed is not None:
                return Standing.FAILED, f"{what} failed: {view.failed}"
            lists = view.lists
            if lists is not None and self.roster.has(lists.verified, peer):
                return Standing.VERIFIED, None
            if lists is not None and self.roster.has(lists.received, peer):
                return Standing.RECEIVED, None
        whole = None if step is None else self._fresh(round_, None, since_ms)
        if whole is not None and whole.failed is not None:
            return Standing.FAILED, f"round {round_} failed: {whole.failed}"
        if whole is not None and whole.result is not None:
            return Standing.OVER, f"round {round_} closed without this peer's input to {what}"
        if run.open_round > round_:
            return (
                Standing.OVER,
                f"round {round_} is over (the coordinator is at round {run.open_round})",
            )
        return Standing.UNKNOWN, None

    def refusal(self, view: RoundView, peer: str) -> str | None:
        """The reason the status of ``view`` gives for refusing ``peer``, if it refused it."""
        lists = view.lists
        if lists is None or not self.roster.has(lists.refused, peer):
            return None
        index = self.roster.members(lists.refused).index(peer)
        return lists.reasons[index] if index < len(lists.reasons) else "refused"

    def outcome(self, round_: int, since_ms: int = 0, step: str | None = None) -> Outcome:
        """The current run's result for ``round_`` (or for its ``step``), or the reason it
        failed, or neither yet, from messages stamped at ``since_ms`` or later. A step fails
        with its round; a stepped round fails when every one of its steps did."""
        view = self._fresh(round_, step, since_ms)
        if view is not None and view.result is not None:
            return Outcome(view.result, view.result_peers)
        if view is not None and view.failed is not None:
            return Outcome(failed=view.failed)
        if step is not None:
            whole = self._fresh(round_, None, since_ms)
            if whole is not None and whole.failed is not None:
                return Outcome(failed=f"round {round_} failed: {whole.failed}")
        elif self.steps:
            failed = [self._fresh(round_, s, since_ms) for s in self.steps]
            if all(v is not None and v.result is None and v.failed for v in failed):
                reasons = "; ".join(
                    f"step {s!r}: {v.failed}" for s, v in zip(self.steps, failed, strict=True) if v
                )
                return Outcome(failed=f"every step failed ({reasons})")
        return Outcome()

    def steps_ended(self, round_: int, since_ms: int = 0) -> list[tuple[str, Outcome]]:
        """The steps of ``round_`` whose outcome is known, in the order they were first heard
        of (a stepped job only). When the round failed, every step not heard of ends with it."""
        ended: list[tuple[int, str, Outcome]] = []
        for step in self.steps:
            view = self._fresh(round_, step, since_ms)
            outcome = self.outcome(round_, since_ms, step)
            if outcome.known:
                heard = view.heard if view is not None and view.heard >= 0 else 1 << 62
                ended.append((heard, step, outcome))
        ended.sort(key=lambda item: item[0])
        return [(step, outcome) for _, step, outcome in ended]


def _since(view: RoundView, since_ms: int) -> RoundView:
    """``view`` without what was last stamped before ``since_ms``."""
    if min(view.status_sent_at, view.result_sent_at, view.failed_sent_at) >= since_ms:
        return view
    fresh = RoundView(heard=view.heard)
    if view.status_sent_at >= since_ms:
        fresh.lists, fresh.status_sent_at = view.lists, view.status_sent_at
        fresh.deadline = view.deadline
    if view.result_sent_at >= since_ms:
        fresh.result, fresh.result_peers = view.result, view.result_peers
        fresh.result_sent_at = view.result_sent_at
    if view.failed_sent_at >= since_ms:
        fresh.failed, fresh.failed_sent_at = view.failed, view.failed_sent_at
    return fresh
