"""``gradstore round show``: a round record as JSON, with each peer's status.

A round/2-4 record lists its peers, and what its number means under a coordinator (rounds
counted from 0) and under ``gradstore.flower`` (Flower's, from 1); a stepped round's
round/5 record lists its steps, each with its step record's peers (or why it failed), and
counts the steps (total, completed, pending, failed) and the peers that took part. A step
record (step/1) shows as a round record with its step and tensors. A tree round's tree/1
record lists its groups, each with its leaf and its partial record's peers (or why it
failed), and counts the groups and the peers; a partial record (partial/1) shows as a
round record with its group. With ``--state``, the coordinator's journal adds the round's
stats (and each step's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..coordinator import Journal
from ..dag import CID, cbor
from ..errors import CoordinatorError, Reason
from ..messages import (
    PARTIAL_RECORD_TYPE,
    RECORD_TYPE_STEPPED,
    STEP_RECORD_TYPE,
    TREE_RECORD_TYPE,
    PartialRecord,
    RoundRecord,
    SteppedRoundRecord,
    StepRecord,
    TreeRecord,
    decode_partial_record,
    decode_record,
    decode_step_record,
    decode_stepped_record,
    decode_tree_record,
)
from . import _exit
from ._nodes import node_from_args
from ._patience import Patience


def cmd_round_show(args: argparse.Namespace) -> int:
    cid = CID.parse(args.record)

    async def run() -> tuple[bytes, dict[CID, bytes]]:
        node = node_from_args(args, wait_s=args.timeout)
        try:
            patience = Patience(f"round record {cid} from {node.name}", args.timeout)
            data = await patience.run(node.get_block(cid))
            parts: dict[CID, bytes] = {}  # a stepped round's step records, a tree's partial
            linked: list[tuple[str, CID | None]] = []
            if _type_of(data) == RECORD_TYPE_STEPPED:
                linked = [("step", e.record) for e in decode_stepped_record(data, cid=cid).steps]
            elif _type_of(data) == TREE_RECORD_TYPE:
                groups = decode_tree_record(data, cid=cid).groups
                linked = [("partial", g.record) for g in groups]
            for what, link in linked:
                if link is not None:
                    waiting = Patience(f"{what} record {link} from {node.name}", args.timeout)
                    parts[link] = await waiting.run(node.get_block(link))
            return data, parts
        finally:
            await node.aclose()

    data, blocks = asyncio.run(run())
    kind = _type_of(data)
    record: RoundRecord | StepRecord | SteppedRoundRecord | TreeRecord | PartialRecord
    if kind == RECORD_TYPE_STEPPED:
        record = decode_stepped_record(data, cid=cid)
        steps = {c: decode_step_record(b, cid=c) for c, b in blocks.items()}
        doc = stepped_doc(record, cid, steps)
    elif kind == TREE_RECORD_TYPE:
        record = decode_tree_record(data, cid=cid)
        partials = {c: decode_partial_record(b, cid=c) for c, b in blocks.items()}
        doc = tree_doc(record, cid, partials)
    elif kind == PARTIAL_RECORD_TYPE:
        record = decode_partial_record(data, cid=cid)
        doc = record_doc(record, cid)
    elif kind == STEP_RECORD_TYPE:
        record = decode_step_record(data, cid=cid)
        doc = record_doc(record, cid)
    else:
        record = decode_record(data, cid=cid)
        doc = record_doc(record, cid)
    if args.state:
        state = Path(args.state)
        step = record.step if isinstance(record, StepRecord) else None
        doc["stats"] = _journal_stats(state, record.job, record.round, str(cid), step)
    print(json.dumps(doc, indent=2))
    return _exit.SUCCESS


def _type_of(data: bytes) -> Any:
    """The ``type`` of a record's node (None if it is not a map with one; decoding refuses it)."""
    try:
        node = cbor.decode(data)
    except Exception:  # not DAG-CBOR: the decoder of a round record says why
        return None
    return node.get("type") if isinstance(node, dict) else None


def record_doc(record: RoundRecord | StepRecord | PartialRecord, cid: CID) -> dict[str, Any]:
    """A round/2-4 record, a step record (with its step and tensors, and no ``prev``) or a
    tree's partial record (with its group, and no ``prev``)."""
    absent = sum(Reason.of(e.reason) is Reason.ABSENT for e in record.excluded)
    doc = _head(record, cid)
    if isinstance(record, StepRecord):
        doc |= {"step": record.step, "tensors": list(record.tensors)}
    if isinstance(record, PartialRecord):
        doc["group"] = record.group
    doc |= {
        "method": record.method,
        "params": record.params,
        "coordinator": record.coordinator,
        "output": str(record.output),
    }
    if isinstance(record, RoundRecord):
        doc["prev"] = None if record.prev is None else str(record.prev)
        doc["numbering"] = numbering(record.round)
    doc["peers"] = [
        {
            "peer": i.peer,
            "status": "aggregated",
            "gradient": str(i.gradient),
            "num_samples": i.num_samples,
            "weight": i.weight,
            **({"codec": i.codec.fields()} if i.codec else {}),
            **({} if i.sent_at is None else {"announced_at_ms": i.sent_at}),
        }
        for i in record.inputs
    ] + [
        {
            "peer": e.peer,
            "status": "excluded",
            "reason": e.reason,
            "gradient": None if e.cid is None else str(e.cid),
        }
        for e in record.excluded
    ]
    doc["counts"] = {
        "expected": len(record.inputs) + len(record.excluded),
        "aggregated": len(record.inputs),
        "absent": absent,
        "failed": len(record.excluded) - absent,
    }
    return doc


def _head(
    record: RoundRecord | StepRecord | PartialRecord | SteppedRoundRecord | TreeRecord, cid: CID
) -> dict[str, Any]:
    """What every record's doc begins with: its CID, type, job, run and round."""
    return {
        "record": str(cid),
        "type": record.type,
        "job": record.job,
        "run": record.run,
        "round": record.round,
    }


def numbering(round_: int) -> dict[str, str]:
    """What a round/2-4 record's number means under a coordinator (rounds from 0) and under
    ``gradstore.flower`` (Flower's ``server_round``, from 1): the record does not say which."""
    flower = (
        "none: Flower trains from server_round 1, so a Flower run has no round 0"
        if round_ == 0
        else f"Flower's server_round {round_}, when a GradstoreStrategy wrote it (Flower counts from 1)"
    )
    return {
        "coordinator": f"the job's {_ordinal(round_ + 1)} round, when a gradstore coordinator "
        "wrote it (it counts from 0)",
        "flower": flower,
    }


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def stepped_doc(
    record: SteppedRoundRecord, cid: CID, steps: dict[CID, StepRecord]
) -> dict[str, Any]:
    """A round/5 record: each step's record (or why it failed), and the counts of steps and
    of the peers that took part (announced in any step) and were aggregated."""
    entries, took_part, aggregated = _parts(
        [({"step": e.step}, {}, e.record, e.failed) for e in record.steps], steps
    )
    failed = sum(e["status"] == "failed" for e in entries)
    return {
        **_head(record, cid),
        "coordinator": record.coordinator,
        "output": str(record.output),
        "prev": None if record.prev is None else str(record.prev),
        "steps": entries,
        "counts": {
            "steps": {
                "total": len(entries),
                "completed": len(entries) - failed,
                "pending": 0,
                "failed": failed,
            },
            "peers": len(took_part),
            "aggregated": len(aggregated),
        },
    }


def tree_doc(record: TreeRecord, cid: CID, partials: dict[CID, PartialRecord]) -> dict[str, Any]:
    """A tree/1 record: each group with its leaf and its partial record (or why it failed),
    and the counts of groups and of the peers that took part and were aggregated."""
    heads = [{"group": g.group, "leaf": g.coordinator} for g in record.groups]
    entries, took_part, aggregated = _parts(
        [(h, h, g.record, g.failed) for h, g in zip(heads, record.groups, strict=True)], partials
    )
    failed = sum(e["status"] == "failed" for e in entries)
    return {
        **_head(record, cid),
        "method": record.method,
        "params": record.params,
        "coordinator": record.coordinator,
        "output": str(record.output),
        "prev": None if record.prev is None else str(record.prev),
        "numbering": numbering(record.round),
        "groups": entries,
        "counts": {
            "groups": {"total": len(entries), "completed": len(entries) - failed, "failed": failed},
            "peers": len(took_part),
            "aggregated": len(aggregated),
        },
    }


def _parts(
    parts: Sequence[tuple[dict[str, Any], dict[str, Any], CID | None, str | None]],
    records: Mapping[CID, StepRecord] | Mapping[CID, PartialRecord],
) -> tuple[list[dict[str, Any]], set[str], set[str]]:
    """A stepped or tree round's parts, each ``(head if failed, head if closed, its record
    or None, why it failed)``: their entries (closed: the record's doc), the peers that took
    part (announced: inputs and non-absent exclusions) and the peers aggregated."""
    entries: list[dict[str, Any]] = []
    took_part: set[str] = set()
    aggregated: set[str] = set()
    for failed_head, closed_head, link, why in parts:
        if link is None:
            entries.append({**failed_head, "status": "failed", "reason": why})
            continue
        part = records[link]
        absent = {e.peer for e in part.excluded if Reason.of(e.reason) is Reason.ABSENT}
        took_part.update({i.peer for i in part.inputs} | {e.peer for e in part.excluded} - absent)
        aggregated.update(i.peer for i in part.inputs)
        entries.append({**closed_head, "status": "closed", **record_doc(part, link)})
    return entries, took_part, aggregated


def _journal_stats(
    state: Path, job: str, round_: int, record: str, step: str | None = None
) -> dict[str, Any]:
    """The round's (or step's) stats as the coordinator journaled them, a stepped round's
    with each step's; refuses another job's journal."""
    path = state / "journal.sqlite"
    if not path.is_file():
        raise CoordinatorError(f"no coordinator journal at {path}")
    with Journal(path) as journal:
        if journal.get_meta("job") not in (None, job):
            raise CoordinatorError(f"{path} is the journal of another job")
        if step is not None:
            row = next((r for r in journal.steps(round_) if r.step == step), None)
            if row is None or row.record != record:
                raise CoordinatorError(f"{path} has no closed step {step} with record {record}")
            return journal.step_stats(round_).get(step, {})
        found = next((r for r in journal.rounds() if r.round == round_), None)
        if found is None or found.record != record:
            raise CoordinatorError(f"{path} has no closed round {round_} with record {record}")
        stats = journal.stats(round_) or {}
        by_step = journal.step_stats(round_)
        return stats | {"by_step": by_step} if by_step else stats
