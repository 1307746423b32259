"""The signed step record ``gradstore/step/1``: what one step of a stepped round aggregated.

A stepped job (``[[steps]]`` in its job file) closes, aggregates and publishes each step
of a round on its own. A step's record is a round/4 record's node without ``prev`` (the
chain of rounds runs through the round/5 records, ``messages.stepped_record``) and with
the step's name and its tensor selectors, as the job file lists them::

    {type: "gradstore/step/1", job, run, round, step, tensors: [selector, ...],
     method, params, inputs: [round/4 inputs], excluded, output: <link>, coordinator, sig}

Every input carries its peer's signed announcement (``sent_at``, ``peer_sig``), which in
a stepped job names the step: the signature binds (job, run, round, step, CID,
num_samples). A selector is an exact tensor name or ``prefix.*`` (every name starting
with ``prefix.``). A step that failed has no step record (the round/5 record says why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..dag.cid import CID
from ..errors import MessageError, Reason
from ..format import name_problem
from .keys import SigningKey
from .record import aggregate_meta
from .record_parts import (
    MAX_RECORD_BYTES,
    RecordExclusion,
    RecordInput,
    canonical_exclusions,
    canonical_inputs,
    check_link,
    check_params_map,
    check_round_of,
    check_signed,
    check_sorted,
    check_type,
    exclusions_from_node,
    exclusions_node,
    inputs_from_node,
    inputs_node,
    open_node,
    sign_node,
)
from .schema import check_did, check_step, check_text

STEP_RECORD_TYPE: Final = "gradstore/step/1"
#: A selector ending in this takes every tensor whose name starts with what precedes ``*``.
PATTERN_SUFFIX: Final = ".*"

_KEYS: Final = frozenset(
    {
        "type",
        "job",
        "run",
        "round",
        "step",
        "tensors",
        "method",
        "params",
        "inputs",
        "excluded",
        "output",
        "coordinator",
        "sig",
    }
)
_WHAT: Final = "step record"


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def check_selector(name: str, value: object) -> str:
    """A step's tensor selector: a tensor name, or ``prefix.*`` (``prefix`` non-empty);
    ``*`` nowhere else, and the name (or prefix) one a document may carry."""
    if not isinstance(value, str) or not value:
        raise MessageError(
            Reason.MALFORMED, f"`{name}` must be a tensor name or `prefix.*`, got {value!r:.70}"
        )
    pattern = value.endswith(PATTERN_SUFFIX) and len(value) > len(PATTERN_SUFFIX)
    text = value[:-1] if pattern else value
    if "*" in text:
        raise MessageError(
            Reason.MALFORMED, f"`{name}` {value!r:.70}: `*` is only allowed as `prefix.*`"
        )
    problem = name_problem(text)
    if problem is not None:
        raise MessageError(Reason.MALFORMED, f"`{name}` {value!r:.70} {problem}")
    return value


def check_selectors(name: str, value: object) -> tuple[str, ...]:
    """A non-empty list of distinct selectors, in the order given (the job file's)."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a list of tensor selectors")
    out = tuple(check_selector(f"{name}[{i}]", s) for i, s in enumerate(value))
    if not out:
        raise MessageError(Reason.MALFORMED, f"`{name}` lists no selector")
    if len(set(out)) != len(out):
        raise MessageError(Reason.MALFORMED, f"`{name}` lists a selector twice")
    return out


@dataclass(frozen=True, slots=True)
class StepRecord:
    """The unsigned content of a step record; ``encode_step_record`` signs it as
    ``coordinator``. Its inputs all carry their peers' signed announcements."""

    job: str
    run: str
    round: int
    step: str
    tensors: tuple[str, ...]
    method: str
    params: dict[str, Any]
    inputs: tuple[RecordInput, ...]
    excluded: tuple[RecordExclusion, ...]
    output: CID
    coordinator: str

    def __post_init__(self) -> None:
        check_round_of(self.job, self.run, self.round)
        check_step("step", self.step)
        _set(self, "tensors", check_selectors("tensors", self.tensors))
        check_text("method", self.method)
        _set(self, "params", check_params_map(self.params))
        inputs = canonical_inputs(self.inputs)
        if not inputs or inputs[0].peer_sig is None:
            raise MessageError(
                Reason.MALFORMED, "a step record lists at least one input, each with `peer_sig`"
            )
        _set(self, "inputs", inputs)
        _set(self, "excluded", canonical_exclusions(self.excluded))
        check_link("output", self.output)
        check_did("coordinator", self.coordinator)

    @property
    def type(self) -> str:
        """The record's ``type``: ``gradstore/step/1``."""
        return STEP_RECORD_TYPE


def _unsigned_node(rec: StepRecord) -> dict[str, Any]:
    return {
        "type": STEP_RECORD_TYPE,
        "job": rec.job,
        "run": rec.run,
        "round": rec.round,
        "step": rec.step,
        "tensors": list(rec.tensors),
        "method": rec.method,
        "params": rec.params,
        "inputs": inputs_node(rec.inputs, codecs=True, signed=True),
        "excluded": exclusions_node(rec.excluded),
        "output": rec.output,
        "coordinator": rec.coordinator,
    }


def encode_step_record(rec: StepRecord, key: SigningKey) -> tuple[CID, bytes]:
    """The signed DAG-CBOR bytes of ``rec`` and their CID; ``key`` must be the coordinator's."""
    return sign_node(_unsigned_node(rec), rec.coordinator, key, _WHAT)


def decode_step_record(
    data: bytes, *, cid: CID | None = None, max_bytes: int = MAX_RECORD_BYTES
) -> StepRecord:
    """Check ``data`` against ``cid`` (IntegrityError), its schema and the coordinator's signature.

    Refusals: ``IntegrityError`` for a hash mismatch, ``MessageError`` with reason
    too-large, malformed or bad-signature otherwise.
    """
    node, sig = open_node(data, cid, max_bytes, _KEYS, _WHAT)
    check_type(node, STEP_RECORD_TYPE)
    inputs = inputs_from_node(node["inputs"], codecs=True, signed=True)
    excluded = exclusions_from_node(node["excluded"])
    rec = StepRecord(
        job=node["job"],
        run=node["run"],
        round=node["round"],
        step=node["step"],
        tensors=node["tensors"],
        method=node["method"],
        params=node["params"],
        inputs=tuple(inputs),
        excluded=tuple(excluded),
        output=check_link("output", node["output"]),
        coordinator=node["coordinator"],
    )
    check_sorted(rec, inputs, excluded)
    check_signed(node, _unsigned_node(rec), rec.coordinator, sig, _WHAT)
    return rec


def step_aggregate_meta(
    job: str, round_: int, step: str, method: str, inputs: Sequence[CID], *, run: str
) -> dict[str, Any]:
    """The meta of a step's aggregate document (docs/spec.md, section 9.4): a round's
    aggregate meta (``record.aggregate_meta``: kind, job, run, round, method and the input
    CIDs in record order) and the step's name."""
    return {**aggregate_meta(job, round_, method, inputs, run=run), "step": step}
