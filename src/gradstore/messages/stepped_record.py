"""The signed round record of a stepped round, ``gradstore/round/5``: its steps and the model.

A stepped round closes each step on its own (``messages.step_record``); when every step
has closed or failed the coordinator signs one round record that links each closed step's
record and aggregate, says why each failed step failed, links the model-level output (one
document holding every closed step's tensors) and the previous round's record::

    {type: "gradstore/round/5", job, run, round,
     steps: [{step, record: <link>, output: <link>} | {step, failed: reason}, ...],
     output: <link>, prev: <link> | null, coordinator, sig}

``steps`` is in the job's order (backward: the output layer's step first), each name once,
and at least one step closed (a round where every step failed has no record, like a
failed round of a job without steps). A failed step has no step record: only its name
and the reason. Unstepped jobs keep writing round/4 records (``messages.record``).

A step owned by another coordinator than the record's (a round split among several,
docs/design/multicoord.md) carries ``coordinator``, its owner's did, in its entry:
``{step, record, output, coordinator}`` or ``{step, failed, coordinator}``. It is left out
when the owner is the record's coordinator, so a single-coordinator record is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..dag.cid import CID
from ..errors import MessageError, Reason
from .keys import SigningKey
from .record_parts import (
    MAX_RECORD_BYTES,
    check_link,
    check_outcome,
    check_prev,
    check_round_of,
    check_signed,
    check_type,
    entries_from_node,
    open_node,
    prev_from_node,
    sign_node,
    typed,
)
from .schema import check_did, check_step
from .step_record import StepRecord

RECORD_TYPE_STEPPED: Final = "gradstore/round/5"

_KEYS: Final = frozenset(
    {"type", "job", "run", "round", "steps", "output", "prev", "coordinator", "sig"}
)
_CLOSED_KEYS: Final = frozenset({"step", "record", "output"})
_FAILED_KEYS: Final = frozenset({"step", "failed"})
#: The optional key of a step entry: the step's owner, when not the record's coordinator.
_OWNER_KEY: Final = "coordinator"
_WHAT: Final = "round record"


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True, slots=True)
class RoundStep:
    """One step of a stepped round: its step record and aggregate, or why it failed;
    ``coordinator``: its owner, when another coordinator than the round record's owns it."""

    step: str
    record: CID | None = None
    output: CID | None = None
    failed: str | None = None
    coordinator: str | None = None

    def __post_init__(self) -> None:
        check_step("steps.step", self.step)
        if self.coordinator is not None:
            check_did("steps.coordinator", self.coordinator)
        check_outcome(
            "steps", "step", self.step, self.record, self.output, self.failed, "step record"
        )


@dataclass(frozen=True, slots=True)
class SteppedRoundRecord:
    """The unsigned content of a round/5 record; ``encode_stepped_record`` signs it as
    ``coordinator``."""

    job: str
    run: str
    round: int
    steps: tuple[RoundStep, ...]
    output: CID
    prev: CID | None
    coordinator: str

    def __post_init__(self) -> None:
        check_round_of(self.job, self.run, self.round)
        steps = tuple(typed(self.steps, RoundStep, "steps"))
        names = [s.step for s in steps]
        if len(set(names)) != len(names):
            raise MessageError(Reason.MALFORMED, "`steps` names a step twice")
        if all(s.failed is not None for s in steps):
            raise MessageError(Reason.MALFORMED, "a round/5 record has at least one closed step")
        if any(s.coordinator == self.coordinator for s in steps):
            raise MessageError(
                Reason.MALFORMED,
                "a step's `coordinator` is left out when it is the record's (one encoding)",
            )
        _set(self, "steps", steps)
        check_link("output", self.output)
        check_prev(self.prev)
        check_did("coordinator", self.coordinator)

    @property
    def type(self) -> str:
        """The record's ``type``: ``gradstore/round/5``."""
        return RECORD_TYPE_STEPPED

    def step_of(self, name: str) -> RoundStep | None:
        """The entry of step ``name``, or None if the round has no such step."""
        return next((s for s in self.steps if s.step == name), None)

    def owner(self, entry: RoundStep) -> str:
        """Who must have signed ``entry``'s step record: its ``coordinator``, else ours."""
        return self.coordinator if entry.coordinator is None else entry.coordinator


def check_step_of(record: SteppedRoundRecord, cid: CID, step: StepRecord) -> None:
    """MessageError("malformed") unless ``step`` (the record ``cid`` names) is the one
    ``record`` links for its step: same job, run and round, signed by the step's owner
    (``SteppedRoundRecord.owner``), same output."""
    entry = record.step_of(step.step)
    if entry is None or entry.record is None:
        raise MessageError(
            Reason.MALFORMED, f"round {record.round} links no record of step {step.step!r}"
        )
    if entry.record.to_v1() != cid.to_v1():
        raise MessageError(
            Reason.MALFORMED, f"step {step.step!r}'s record is {entry.record}, not {cid}"
        )
    if (step.job, step.run, step.round) != (record.job, record.run, record.round):
        raise MessageError(Reason.MALFORMED, f"step record {cid} is of another job, run or round")
    owner = record.owner(entry)
    if step.coordinator != owner:
        raise MessageError(
            Reason.MALFORMED,
            f"step {step.step!r}'s record {cid} is signed by {step.coordinator}, "
            f"not by the step's owner {owner}",
        )
    if entry.output != step.output:
        raise MessageError(
            Reason.MALFORMED,
            f"step {step.step!r}'s output is {step.output}, the round says {entry.output}",
        )


def _step_node(entry: RoundStep) -> dict[str, Any]:
    node: dict[str, Any]
    if entry.failed is not None:
        node = {"step": entry.step, "failed": entry.failed}
    else:
        node = {"step": entry.step, "record": entry.record, "output": entry.output}
    if entry.coordinator is not None:
        node[_OWNER_KEY] = entry.coordinator
    return node


def _unsigned_node(rec: SteppedRoundRecord) -> dict[str, Any]:
    return {
        "type": RECORD_TYPE_STEPPED,
        "job": rec.job,
        "run": rec.run,
        "round": rec.round,
        "steps": [_step_node(s) for s in rec.steps],
        "output": rec.output,
        "prev": rec.prev,
        "coordinator": rec.coordinator,
    }


def encode_stepped_record(rec: SteppedRoundRecord, key: SigningKey) -> tuple[CID, bytes]:
    """The signed DAG-CBOR bytes of ``rec`` and their CID; ``key`` must be the coordinator's."""
    return sign_node(_unsigned_node(rec), rec.coordinator, key, _WHAT)


def decode_stepped_record(
    data: bytes, *, cid: CID | None = None, max_bytes: int = MAX_RECORD_BYTES
) -> SteppedRoundRecord:
    """Check ``data`` against ``cid`` (IntegrityError), its schema and the coordinator's signature.

    Refusals: ``IntegrityError`` for a hash mismatch, ``MessageError`` with reason
    too-large, malformed or bad-signature otherwise.
    """
    node, sig = open_node(data, cid, max_bytes, _KEYS, _WHAT)
    check_type(node, RECORD_TYPE_STEPPED)
    entries = entries_from_node(
        "steps", node["steps"], _CLOSED_KEYS, _FAILED_KEYS, frozenset({_OWNER_KEY})
    )
    steps = [
        RoundStep(
            step=entry["step"],
            record=entry.get("record"),
            output=entry.get("output"),
            failed=entry.get("failed"),
            coordinator=entry.get(_OWNER_KEY),
        )
        for entry in entries
    ]
    rec = SteppedRoundRecord(
        job=node["job"],
        run=node["run"],
        round=node["round"],
        steps=tuple(steps),
        output=check_link("output", node["output"]),
        prev=prev_from_node(node),
        coordinator=node["coordinator"],
    )
    check_signed(node, _unsigned_node(rec), rec.coordinator, sig, _WHAT)
    return rec


#: The ``kind`` in the meta of a stepped round's model-level document.
MODEL_KIND: Final = "model"


def model_meta(
    job: str, round_: int, steps: Sequence[str], outputs: Sequence[CID], *, run: str
) -> dict[str, Any]:
    """The meta of a stepped round's model-level document (docs/spec.md, section 9.4): its
    job, run and round, and its closed steps' names and output CIDs (base32 CIDv1 text), in
    the round record's order."""
    if len(steps) != len(outputs):
        raise ValueError(f"{len(steps)} steps and {len(outputs)} outputs")
    return {
        "job": job,
        "kind": MODEL_KIND,
        "outputs": [str(c.to_v1()) for c in outputs],
        "round": round_,
        "run": run,
        "steps": list(steps),
    }


def record_model_meta(record: SteppedRoundRecord) -> dict[str, Any]:
    """:func:`model_meta` of ``record``'s closed steps: what its ``output``'s meta must be."""
    closed = [s for s in record.steps if s.output is not None]
    return model_meta(
        record.job,
        record.round,
        [s.step for s in closed],
        [s.output for s in closed if s.output is not None],
        run=record.run,
    )
