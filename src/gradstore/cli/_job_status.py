"""What ``gradstore round status`` shows of a job: its open round (each step's peers, verified
out of quorum, deadline), and the last round that ended, built from what a
``CoordinatorListener`` heard (verified, signed messages only). Pure: no I/O.

A tree job (``[[groups]]``, ``tree_status``): the round and its result as the root says
them, and each group as its leaf does (its peers, verified out of its quorum; closed with
its partial record; failed with the leaf's reason; or nothing heard of it), in the open
round and in the last one that ended.

Only messages stamped at or after ``since_ms`` (when the command began to listen) count: the
coordinator re-sends the open round's statuses and its last results with fresh stamps every
few seconds, and a replayed message was stamped before.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from ..job import GroupConfig, JobConfig, StepConfig
from ..messages import Roster
from ..peer import CoordinatorView, RoundView

#: Seconds a status command listens for the coordinator before it says it heard none.
HEAR_S: Final = 3.0

#: Seconds without a word from a coordinator heard before that ``--watch`` calls it silent
#: (it re-sends its state every 2 s).
SILENT_S: Final = 15.0


@dataclass(frozen=True)
class PeerStatus:
    """One peer of one step: ``received``, ``verified``, ``refused`` (with the coordinator's
    reason), ``absent``; once the step closed, ``aggregated`` or ``excluded``."""

    peer: str
    state: str
    reason: str | None = None


@dataclass(frozen=True)
class StepState:
    """One step of the open round (``step`` None: the round of a job without steps), or a
    tree job's group (``step`` its name, ``leaf`` its leaf coordinator): ``open``,
    ``closed`` (its aggregate and record; a group's partial document and record),
    ``failed`` (why), or ``unheard``."""

    step: str | None
    state: str
    verified: int
    expected: int
    quorum: int
    deadline_s: float
    peers: tuple[PeerStatus, ...]
    failed: str | None = None
    output: str | None = None
    record: str | None = None
    #: when the open step's deadline falls (unix ms), as the coordinator's signed status says
    deadline_at_ms: int | None = None
    #: a tree job's group: its leaf's did (None: a step)
    leaf: str | None = None
    #: a tree job's group: the stamp of its leaf's latest word (unix ms; None: none heard)
    heard_at_ms: int | None = None


@dataclass(frozen=True)
class Ended:
    """The last round the coordinator said ended: ``closed`` with its aggregate, record,
    method and aggregated peers, or ``failed`` with why."""

    round: int
    state: str
    output: str | None = None
    record: str | None = None
    method: str | None = None
    peers: int = 0
    reason: str | None = None
    #: a tree job's round: each group as its leaf said it of this round
    groups: tuple[StepState, ...] = ()


@dataclass(frozen=True)
class JobStatus:
    """A job as its coordinator's signed messages describe it (``heard`` False: none came)."""

    job: str
    coordinator: str
    topic: str
    rounds: int
    heard: bool
    stale: bool = False
    silent: bool = False
    run: str | None = None
    open_round: int | None = None
    steps: tuple[StepState, ...] = ()
    last: Ended | None = None

    @property
    def complete(self) -> bool:
        """Whether the job's last round has ended (never, for a job of unbounded rounds)."""
        return (
            self.rounds > 0
            and self.open_round is None
            and self.last is not None
            and self.last.round >= self.rounds - 1
        )

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object (its keys are listed in the README, "Watching a job")."""
        return {
            "job": self.job,
            "coordinator": self.coordinator,
            "topic": self.topic,
            "heard": self.heard,
            "silent": self.silent,
            "run": self.run,
            "rounds": self.rounds,
            "complete": self.complete,
            "open": None
            if self.open_round is None
            else {"round": self.open_round, **_parts_json(self.steps)},
            "last": None if self.last is None else _ended_json(self.last),
        }

    def lines(self) -> list[str]:
        """The text a person reads: a headline, each step and its peers, the last round."""
        if not self.heard:
            why = (
                "heard only messages stamped before this command started (replays, or this "
                "machine's clock is ahead of the coordinator's)"
                if self.stale
                else "is `gradstore coordinator` running, and connected to this node?"
            )
            return [
                f"job {self.job}: no coordinator heard on {self.topic} within {HEAR_S:g} s ({why})"
            ]
        head = f"job {self.job}, run {self.run}: "
        if self.open_round is not None:
            of = f" of {self.rounds}" if self.rounds else ""
            head += f"round {self.open_round}{of} open"
        elif self.complete:
            head += f"complete ({self.rounds} round(s))"
        else:
            head += "no round open"
        if self.silent:
            head += f" (the coordinator has been silent for over {SILENT_S:g} s)"
        out = [head]
        for step in self.steps:
            out += _step_lines(step)
        if self.last is not None:
            out.append(_ended_line(self.last))
            for group in self.last.groups:
                out += _step_lines(group)
        return out


def job_status(
    config: JobConfig,
    view: CoordinatorView,
    since_ms: int,
    *,
    silent: bool = False,
) -> JobStatus:
    """``config``'s job as ``view`` heard it from messages stamped at ``since_ms`` or later."""
    base = JobStatus(
        config.job, config.coordinator, config.results_topic, config.rounds.count, heard=False
    )
    run = view.current
    if run is None or run.last_sent_at < since_ms:
        return replace(base, stale=run is not None)
    names: list[str | None] = [s.name for s in config.steps] if config.stepped else [None]
    heard = {r for (r, _) in run.rounds}
    last = _last_ended(view, heard, since_ms)
    floor = -1 if last is None else last.round
    open_rounds = sorted(
        r
        for r in heard
        if r > floor
        and any(view.slot(r, s, since_ms) is not None for s in names)
        and not _ended(view.slot(r, None, since_ms))
    )
    open_round = open_rounds[0] if open_rounds else None
    steps: tuple[StepState, ...] = ()
    if open_round is not None:
        steps = tuple(
            _step_state(view, config_step, open_round, name, since_ms)
            for config_step, name in zip(config.steps, names, strict=True)
        )
    return replace(
        base, heard=True, silent=silent, run=run.run, open_round=open_round, steps=steps, last=last
    )


def tree_status(
    config: JobConfig,
    root: CoordinatorView,
    groups: Mapping[str, CoordinatorView],
    since_ms: int,
    *,
    silent: bool = False,
) -> JobStatus:
    """A tree job (``config.groups``) as its root's view and each group's leaf's (``groups``,
    by name: a ``CoordinatorListener`` with ``partials``) heard it: the root's round and
    result, each group's part of the open round and of the last that ended."""
    status = job_status(config, root, since_ms, silent=silent)

    def parts(round_: int, ended: RoundView | None = None) -> tuple[StepState, ...]:
        return tuple(
            _group_state(config, g, groups[g.name], round_, since_ms, root.roster, ended)
            for g in config.groups
        )

    last = status.last
    if last is not None:
        last = replace(last, groups=parts(last.round, root.slot(last.round, None, since_ms)))
    steps = () if status.open_round is None else parts(status.open_round)
    return replace(status, steps=steps, last=last)


def _group_state(
    config: JobConfig,
    group: GroupConfig,
    view: CoordinatorView,
    round_: int,
    since_ms: int,
    roster: Roster,
    ended: RoundView | None,
) -> StepState:
    """``group``'s part of ``round_`` as its leaf's view says it (a step of its group's
    view). Of a round that ended (``ended``: the root's word of it) with no result or
    failure heard from the leaf, the root's result says whether the group is in it."""
    step = config.group_view(group.name).steps[0]
    state = _step_state(view, step, round_, None, since_ms)
    current = view.current
    heard = None if current is None or current.last_sent_at < since_ms else current.last_sent_at
    state = replace(state, step=group.name, leaf=group.coordinator, heard_at_ms=heard)
    if ended is None or state.state in ("closed", "failed"):
        return state
    took = [p for p in group.peers if ended.result and roster.has(ended.result_peers, p)]
    if took:  # the root took a part of the leaf's this listener did not hear
        peers = tuple(PeerStatus(p, "aggregated" if p in took else "excluded") for p in group.peers)
        return replace(state, state="closed", verified=len(took), peers=peers, deadline_at_ms=None)
    why = "none of its peers is in the round's result (the root's record says why)"
    return replace(state, state="failed", failed=why, deadline_at_ms=None)


def _ended(slot: RoundView | None) -> bool:
    return slot is not None and (slot.result is not None or slot.failed is not None)


def _last_ended(view: CoordinatorView, rounds: set[int], since_ms: int) -> Ended | None:
    """The highest round whose own result or failure was heard."""
    for r in sorted(rounds, reverse=True):
        slot = view.slot(r, None, since_ms)
        if slot is None:
            continue
        if slot.result is not None:
            result = slot.result
            peers = len(view.roster.members(slot.result_peers))
            return Ended(r, "closed", result.cid, result.record, result.method, peers)
        if slot.failed is not None:
            return Ended(r, "failed", reason=slot.failed)
    return None


def _step_state(
    view: CoordinatorView, config: StepConfig, round_: int, step: str | None, since_ms: int
) -> StepState:
    slot = view.slot(round_, step, since_ms)
    roster = view.roster
    members = [p for p in roster if p in config.peers]
    peers: list[PeerStatus] = []
    state, counted = "unheard", "verified"
    if slot is not None and slot.result is not None:
        state, counted = "closed", "aggregated"
        for p in members:
            if roster.has(slot.result_peers, p):
                peers.append(PeerStatus(p, "aggregated"))
            else:
                peers.append(PeerStatus(p, "excluded", view.refusal(slot, p)))
    elif slot is not None:
        state = "open" if slot.failed is None else "failed"
        peers = [_open_peer(view, slot, p) for p in members]
    result = None if slot is None else slot.result
    return StepState(
        step,
        state,
        verified=sum(p.state == counted for p in peers),
        expected=len(members),
        quorum=config.quorum,
        deadline_s=config.deadline_s,
        peers=tuple(peers),
        failed=None if slot is None else slot.failed,
        output=None if result is None else result.cid,
        record=None if result is None else result.record,
        deadline_at_ms=None if slot is None or state != "open" else slot.deadline,
    )


def _open_peer(view: CoordinatorView, slot: RoundView, peer: str) -> PeerStatus:
    reason = view.refusal(slot, peer)
    if reason is not None:
        return PeerStatus(peer, "refused", reason)
    lists = slot.lists
    if lists is not None and view.roster.has(lists.verified, peer):
        return PeerStatus(peer, "verified")
    if lists is not None and view.roster.has(lists.received, peer):
        return PeerStatus(peer, "received")
    return PeerStatus(peer, "absent")


def _parts_json(steps: tuple[StepState, ...]) -> dict[str, Any]:
    """The open round's steps, or a tree round's groups."""
    if any(s.leaf is not None for s in steps):
        return {"groups": [_step_json(s) for s in steps]}
    return {"steps": [_step_json(s) for s in steps]}


def _step_json(step: StepState) -> dict[str, Any]:
    part = {"step": step.step} if step.leaf is None else {"group": step.step, "leaf": step.leaf}
    return {
        **part,
        "state": step.state,
        "verified": step.verified,
        "expected": step.expected,
        "quorum": step.quorum,
        "deadline_s": step.deadline_s,
        "deadline_at_ms": step.deadline_at_ms,
        "failed": step.failed,
        "output": step.output,
        "record": step.record,
        **({} if step.leaf is None else {"leaf_heard_at_ms": step.heard_at_ms}),
        "peers": [{"peer": p.peer, "state": p.state, "reason": p.reason} for p in step.peers],
    }


def _ended_json(last: Ended) -> dict[str, Any]:
    return {
        "round": last.round,
        "state": last.state,
        "output": last.output,
        "record": last.record,
        "method": last.method,
        "peers": last.peers,
        "reason": last.reason,
        **(_parts_json(last.groups) if last.groups else {}),
    }


def _step_lines(step: StepState) -> list[str]:
    name = "" if step.step is None else f"step {step.step}: "
    if step.leaf is not None:
        name = f"group {step.step} (leaf {step.leaf}): "
    if step.state == "closed":
        output = "aggregate" if step.leaf is None else "partial"
        text = f"closed, {step.verified}/{step.expected} aggregated"
        if step.record is not None:
            text += f", {output} {step.output} record {step.record}"
    elif step.state == "unheard":
        text = "nothing heard of it yet" if step.leaf is None else "nothing heard from its leaf"
    else:
        deadline = (
            f"{step.deadline_s:g} s from the round's first announcement"
            if step.deadline_at_ms is None
            else _clock(step.deadline_at_ms)
        )
        text = (
            f"{step.verified}/{step.expected} verified, quorum {step.quorum}, deadline {deadline}"
        )
        if step.state == "failed":
            text = f"failed: {step.failed} ({text})"
        elif name:
            text = f"open, {text}"
    if step.leaf is not None and step.heard_at_ms is not None and step.state == "open":
        text += f", its leaf last heard {_clock(step.heard_at_ms)}"
    out = [f"  {name}{text}"]
    width = max((len(p.state) for p in step.peers), default=0)
    for p in step.peers:
        reason = "" if p.reason is None else f"  {p.reason}"
        out.append(f"    {p.state:<{width}}  {p.peer}{reason}")
    return out


def _clock(unix_ms: int) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(unix_ms / 1000))


def _ended_line(last: Ended) -> str:
    if last.state == "failed":
        return f"last: round {last.round} failed: {last.reason}"
    return (
        f"last: round {last.round} closed, aggregate {last.output} record {last.record} "
        f"({last.method}, {last.peers} peer(s))"
    )
