"""What a peer has heard from its coordinator, and what it means for a round: pure, no I/O.

The coordinator's statuses and results arrive signed, but pubsub may deliver them late,
twice, or replayed by anyone, including messages of an earlier run of the same job. So a
peer keeps them per run, follows the run whose messages are the most recent (every
message it keeps was stamped within the job's clock-skew window), and answers questions
about one round of that run from messages stamped after a given time (``since_ms``: when
it announced, or began to wait): a replayed message was stamped before, and cannot
acknowledge an announcement or stand for a result. The live coordinator re-sends what
matters with fresh stamps, so waiting for a fresh one costs at most one re-broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ..messages import PeerLists, Result, Roster, Status


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
    """One round of one run: the latest status lists, and its result or failure."""

    lists: PeerLists | None = None
    status_sent_at: int = -1
    result: Result | None = None
    result_peers: bytes = b""
    result_sent_at: int = -1
    failed: str | None = None
    failed_sent_at: int = -1


@dataclass
class RunView:
    """Everything heard about one run of the job."""

    run: str
    last_sent_at: int = 0
    open_round: int = 0
    rounds: dict[int, RoundView] = field(default_factory=dict)

    def round(self, r: int) -> RoundView:
        view = self.rounds.get(r)
        if view is None:
            view = self.rounds[r] = RoundView()
        return view


class CoordinatorView:
    """The runs heard of, and the current one: the run of the most recent message."""

    def __init__(self, roster: Roster) -> None:
        self.roster = roster
        self.runs: dict[str, RunView] = {}
        self.current: RunView | None = None

    def _run(self, run: str, sent_at: int) -> RunView:
        view = self.runs.get(run)
        if view is None:
            view = self.runs[run] = RunView(run)
        view.last_sent_at = max(view.last_sent_at, sent_at)
        if self.current is None or view.last_sent_at > self.current.last_sent_at:
            self.current = view
        return view

    def see_status(self, status: Status, lists: PeerLists) -> None:
        """Record a verified, fresh status whose lists are ``lists`` (inline or fetched)."""
        run = self._run(status.run, status.sent_at)
        view = run.round(status.round)
        if status.failed is not None:
            view.failed = status.failed
            view.failed_sent_at = max(view.failed_sent_at, status.sent_at)
        else:
            run.open_round = max(run.open_round, status.round)
        if status.sent_at >= view.status_sent_at:
            view.lists, view.status_sent_at = lists, status.sent_at

    def see_result(self, result: Result, lists: PeerLists) -> None:
        """Record a verified, fresh result whose peer bitmap is in ``lists``."""
        run = self._run(result.run, result.sent_at)
        view = run.round(result.round)
        if view.result is None:
            view.result, view.result_peers = result, lists.peers
        view.result_sent_at = max(view.result_sent_at, result.sent_at)
        run.open_round = max(run.open_round, result.round + 1)

    def standing(self, round_: int, peer: str, since_ms: int = 0) -> tuple[Standing, str | None]:
        """Where ``peer``'s input for ``round_`` of the current run stands, with a reason,
        from messages stamped at ``since_ms`` or later."""
        run = self.current
        if run is None or run.last_sent_at < since_ms:
            return Standing.UNKNOWN, None
        view = run.rounds.get(round_)
        if view is not None:
            view = _since(view, since_ms)
            if view.result is not None:
                if self.roster.has(view.result_peers, peer):
                    return Standing.VERIFIED, None
                reason = self.refusal(view, peer)
                if reason is not None:
                    return Standing.REFUSED, reason
                return Standing.OVER, f"round {round_} closed without this peer's input"
            reason = self.refusal(view, peer)
            if reason is not None:
                return Standing.REFUSED, reason
            if view.failed is not None:
                return Standing.FAILED, f"round {round_} failed: {view.failed}"
            lists = view.lists
            if lists is not None and self.roster.has(lists.verified, peer):
                return Standing.VERIFIED, None
            if lists is not None and self.roster.has(lists.received, peer):
                return Standing.RECEIVED, None
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

    def outcome(self, round_: int, since_ms: int = 0) -> tuple[Result | None, str | None]:
        """The current run's result for ``round_``, or the reason it failed, or neither yet,
        from messages stamped at ``since_ms`` or later."""
        run = self.current
        view = None if run is None else run.rounds.get(round_)
        if view is None:
            return None, None
        view = _since(view, since_ms)
        return view.result, view.failed


def _since(view: RoundView, since_ms: int) -> RoundView:
    """``view`` without what was last stamped before ``since_ms``."""
    if min(view.status_sent_at, view.result_sent_at, view.failed_sent_at) >= since_ms:
        return view
    fresh = RoundView()
    if view.status_sent_at >= since_ms:
        fresh.lists, fresh.status_sent_at = view.lists, view.status_sent_at
    if view.result_sent_at >= since_ms:
        fresh.result, fresh.result_peers = view.result, view.result_peers
        fresh.result_sent_at = view.result_sent_at
    if view.failed_sent_at >= since_ms:
        fresh.failed, fresh.failed_sent_at = view.failed, view.failed_sent_at
    return fresh
