"""``gradstore round show``: a round record as JSON, with each peer's status.

A round/2-4 record lists its peers, and what its number means under a coordinator (rounds
counted from 0) and under ``gradstore.flower`` (Flower's, from 1); a stepped round's
round/5 record lists its steps, each with its step record's peers (or why it failed), and
counts the steps (total, completed, pending, failed) and the peers that took part. A step
record (step/1) shows as a round record with its step and tensors. With ``--state``, the
coordinator's journal adds the round's stats (and each step's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from ..coordinator import Journal
from ..dag import CID, cbor
from ..errors import CoordinatorError, Reason
from ..messages import (
    RECORD_TYPE_STEPPED,
    STEP_RECORD_TYPE,
    RoundRecord,
    SteppedRoundRecord,
    StepRecord,
    decode_record,
    decode_step_record,
    decode_stepped_record,
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
            steps: dict[CID, bytes] = {}
            if _type_of(data) == RECORD_TYPE_STEPPED:
                for entry in decode_stepped_record(data, cid=cid).steps:
                    if entry.record is not None:
                        what = f"step record {entry.record} from {node.name}"
                        block = await Patience(what, args.timeout).run(node.get_block(entry.record))
                        steps[entry.record] = block
            return data, steps
        finally:
            await node.aclose()

    data, blocks = asyncio.run(run())
    kind = _type_of(data)
    record: RoundRecord | StepRecord | SteppedRoundRecord
    if kind == RECORD_TYPE_STEPPED:
        record = decode_stepped_record(data, cid=cid)
        steps = {c: decode_step_record(b, cid=c) for c, b in blocks.items()}
        doc = stepped_doc(record, cid, steps)
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


def record_doc(record: RoundRecord | StepRecord, cid: CID) -> dict[str, Any]:
    """A round/2-4 record, or a step record (with its step and tensors, and no ``prev``)."""
    absent = sum(Reason.of(e.reason) is Reason.ABSENT for e in record.excluded)
    doc: dict[str, Any] = {
        "record": str(cid),
        "type": record.type,
        "job": record.job,
        "run": record.run,
        "round": record.round,
    }
    if isinstance(record, StepRecord):
        doc |= {"step": record.step, "tensors": list(record.tensors)}
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
    entries: list[dict[str, Any]] = []
    took_part: set[str] = set()
    aggregated: set[str] = set()
    for entry in record.steps:
        if entry.record is None:
            entries.append({"step": entry.step, "status": "failed", "reason": entry.failed})
            continue
        step = steps[entry.record]
        took_part.update(i.peer for i in step.inputs)
        took_part.update(e.peer for e in step.excluded if Reason.of(e.reason) is not Reason.ABSENT)
        aggregated.update(i.peer for i in step.inputs)
        entries.append({"status": "closed", **record_doc(step, entry.record)})
    failed = sum(e["status"] == "failed" for e in entries)
    return {
        "record": str(cid),
        "type": record.type,
        "job": record.job,
        "run": record.run,
        "round": record.round,
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
