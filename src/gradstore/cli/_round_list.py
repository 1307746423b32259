"""``gradstore round list``: a job's past rounds, newest first, by walking its signed record
chain through ``prev`` from the head: the record CID given, or the one the coordinator's
last result names (heard with ``--config``).

Every record is hashed, decoded and its signature checked (``audit.fetch_any_record``);
each must be of the head's job, run and coordinator (with ``--config``: the job file's),
each ``prev`` an earlier round; a stepped round's step records are fetched, checked the
same way and against the round's links. A failure is an ``AuditError`` naming the check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from ..audit import (
    AuditError,
    check_expected,
    fetch_any_record,
    fetch_step_record,
    fetch_with,
)
from ..dag import CID
from ..errors import CoordinatorError, MessageError
from ..job import JobConfig, load_job
from ..messages import (
    RoundRecord,
    SteppedRoundRecord,
    TreeRecord,
    check_partial_of,
    check_step_of,
    decode_partial_record,
)
from ..node import Node
from ..peer import CoordinatorListener
from . import _exit
from ._exit import UsageError
from ._job_status import HEAR_S
from ._nodes import node_from_args
from ._patience import Patience


@dataclass(frozen=True)
class ListedStep:
    """One step of a stepped round: ``closed`` (its record, aggregate, method and aggregated
    peers) or ``failed`` (why)."""

    step: str
    state: str
    record: str | None = None
    output: str | None = None
    method: str | None = None
    peers: tuple[str, ...] = ()
    failed: str | None = None


@dataclass(frozen=True)
class ListedRound:
    """One round record: its CIDs, method (a stepped round's: its steps' joined with ``+``),
    the peers it aggregated, and its steps (None: a round without steps)."""

    job: str
    coordinator: str
    round: int
    type: str
    record: str
    output: str
    prev: str | None
    method: str
    peers: tuple[str, ...]
    steps: tuple[ListedStep, ...] | None = None


def cmd_round_list(args: argparse.Namespace) -> int:
    if args.head is None and args.config is None:
        raise UsageError("give the head record's CID, or --config job.toml to ask the coordinator")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    config = None if args.config is None else load_job(args.config)

    async def run() -> tuple[str | None, list[ListedRound]]:
        node = node_from_args(args, wait_s=args.timeout)
        try:
            head = args.head
            if head is None:
                assert config is not None
                head = await _head_from_coordinator(node, config)
            if head is None:
                return None, []
            return head, await walk(node, head, config, args.limit, args.timeout)
        finally:
            await node.aclose()

    head, rounds = asyncio.run(run())
    if args.json:
        print(json.dumps(_json(config, head, rounds), indent=2))
    elif not rounds:
        assert config is not None
        print(f"job {config.job}: no round has closed yet")
    else:
        print("\n".join(_table(rounds)))
    return _exit.SUCCESS


async def _head_from_coordinator(node: Node, config: JobConfig) -> str | None:
    """The record of the last round the coordinator says closed (None: none closed yet);
    an error when it is not heard within ``HEAR_S`` seconds."""
    since_ms = int(time.time() * 1000)
    async with CoordinatorListener(config, node) as listener:
        start = time.monotonic()
        heard = False
        while (left := start + HEAR_S - time.monotonic()) > 0:
            await listener.next_message(left)
            view = listener.view
            run = view.current
            if run is None or run.last_sent_at < since_ms:
                continue
            heard = True
            closed = [
                (r, slot.result.record)
                for (r, step) in run.rounds
                if step is None
                and (slot := view.slot(r, None, since_ms)) is not None
                and slot.result is not None
            ]
            if closed:
                return max(closed)[1]
    if heard:
        return None
    raise CoordinatorError(
        f"no coordinator of job {config.job} heard on {config.results_topic} within "
        f"{HEAR_S:g} s: give the head record's CID (the record `peer await` printed)",
    )


async def walk(
    node: Node,
    head: CID | str,
    config: JobConfig | None,
    limit: int | None = None,
    timeout: float | None = None,
) -> list[ListedRound]:
    """The rounds from ``head`` back through ``prev`` (at most ``limit``), each record
    checked as the module docstring says."""
    out: list[ListedRound] = []
    pinned = (None, None) if config is None else (config.coordinator, config.job)
    newer: RoundRecord | SteppedRoundRecord | TreeRecord | None = None
    next_cid: CID | str | None = head
    while next_cid is not None and (limit is None or len(out) < limit):
        what = f"round record {next_cid} from {node.name}"
        rcid, record = await Patience(what, timeout).run(fetch_any_record(node, next_cid))
        if newer is None:
            check_expected(rcid, record, *pinned)
        else:
            _check_link(rcid, record, newer)
        if isinstance(record, SteppedRoundRecord):
            out.append(await _stepped(node, rcid, record, timeout))
        elif isinstance(record, TreeRecord):
            out.append(await _tree(node, rcid, record, timeout))
        else:
            out.append(_plain(rcid, record))
        newer, next_cid = record, record.prev
    return out


def _check_link(
    rcid: CID,
    record: RoundRecord | SteppedRoundRecord | TreeRecord,
    newer: RoundRecord | SteppedRoundRecord | TreeRecord,
) -> None:
    """A ``prev`` must name an earlier round of the same job, run and coordinator."""
    check_expected(rcid, record, newer.coordinator, newer.job)
    if record.run != newer.run:
        raise AuditError(
            "run", f"record {rcid} (round {record.round}) is of run {record.run}, not {newer.run}"
        )
    if record.round >= newer.round:
        raise AuditError(
            "round-sequence",
            f"round {newer.round}'s prev is {rcid}, which is round {record.round}",
        )


def _listed(
    rcid: CID,
    record: RoundRecord | TreeRecord | SteppedRoundRecord,
    method: str,
    peers: tuple[str, ...],
    steps: tuple[ListedStep, ...] | None = None,
) -> ListedRound:
    """A listed round: ``record``'s own fields beside what its kind lists (``steps``: a
    stepped round's; None for the others)."""
    prev = None if record.prev is None else str(record.prev)
    return ListedRound(
        record.job,
        record.coordinator,
        record.round,
        record.type,
        str(rcid),
        str(record.output),
        prev,
        method,
        peers,
        steps,
    )


def _plain(rcid: CID, record: RoundRecord) -> ListedRound:
    return _listed(rcid, record, record.method, tuple(i.peer for i in record.inputs))


async def _tree(node: Node, rcid: CID, record: TreeRecord, timeout: float | None) -> ListedRound:
    """A tree round: every peer of its closed groups' partial records (each checked)."""
    peers: list[str] = []
    for entry in record.groups:
        if entry.record is None:
            continue
        what = f"partial record {entry.record} from {node.name}"
        pcid, partial = await Patience(what, timeout).run(
            fetch_with(
                node,
                entry.record,
                f"partial record of group {entry.group!r}",
                lambda data, c: decode_partial_record(data, cid=c),
            )
        )
        try:
            check_partial_of(record, entry, pcid, partial)
        except MessageError as exc:
            raise AuditError("group-link", f"round {record.round} record {rcid}: {exc}") from exc
        peers += [i.peer for i in partial.inputs]
    return _listed(rcid, record, record.method, tuple(sorted(peers)))


async def _stepped(
    node: Node, rcid: CID, record: SteppedRoundRecord, timeout: float | None
) -> ListedRound:
    steps: list[ListedStep] = []
    for entry in record.steps:
        if entry.record is None:
            steps.append(ListedStep(entry.step, "failed", failed=entry.failed))
            continue
        what = f"step record {entry.record} from {node.name}"
        scid, step = await Patience(what, timeout).run(
            fetch_step_record(node, entry.record, entry.step)
        )
        try:
            check_step_of(record, scid, step)
        except MessageError as exc:
            raise AuditError("step-link", f"round {record.round} record {rcid}: {exc}") from exc
        peers = tuple(i.peer for i in step.inputs)
        steps.append(
            ListedStep(step.step, "closed", str(scid), str(step.output), step.method, peers)
        )
    closed = [s for s in steps if s.state == "closed"]
    method = "+".join(dict.fromkeys(s.method for s in closed if s.method))
    peers = tuple(sorted({p for s in closed for p in s.peers}))
    return _listed(rcid, record, method, peers, tuple(steps))


def _json(config: JobConfig | None, head: str | None, rounds: list[ListedRound]) -> dict[str, Any]:
    """The ``--json`` object (its keys are listed in the README, "Watching a job")."""
    first = rounds[0] if rounds else None
    return {
        "job": config.job if config is not None else first and first.job,
        "coordinator": config.coordinator if config is not None else first and first.coordinator,
        "head": head,
        "rounds": [_round_json(r) for r in rounds],
    }


def _round_json(r: ListedRound) -> dict[str, Any]:
    return {
        "round": r.round,
        "type": r.type,
        "record": r.record,
        "output": r.output,
        "prev": r.prev,
        "method": r.method,
        "peers": list(r.peers),
        "steps": None
        if r.steps is None
        else [
            {
                "step": s.step,
                "state": s.state,
                "record": s.record,
                "output": s.output,
                "method": s.method,
                "peers": list(s.peers),
                "failed": s.failed,
            }
            for s in r.steps
        ],
    }


def _table(rounds: list[ListedRound]) -> list[str]:
    """A header and one line per round, in aligned columns."""
    rows = [("ROUND", "RECORD", "OUTPUT", "METHOD", "PEERS", "STEPS")]
    for r in rounds:
        steps = "-" if r.steps is None else ",".join(_step_cell(s) for s in r.steps)
        rows.append((str(r.round), r.record, r.output, r.method, str(len(r.peers)), steps))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    ]


def _step_cell(step: ListedStep) -> str:
    return step.step if step.state == "closed" else f"{step.step}(failed)"
