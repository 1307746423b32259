"""The signed DAG-CBOR round record: what a round aggregated, how, and what it refused.

Node shape (DAG-CBOR sorts map keys by length, then bytes)::

    {type: "gradstore/round/2", job, run, round, method, params,
     inputs: [{peer, gradient: <link>, num_samples, weight}],   sorted by peer
     excluded: [{peer, cid?: "<CID text>", reason}],            sorted by (peer, cid, reason)
     output: <link>, prev: <link> | null, coordinator, sig}

A round with a compressed input is ``gradstore/round/3``: the same node with a ``codec``
in every input (the document's codec map, or null for a dense input), so an auditor can
check what each input's codec was. A round/3 record whose codecs are all null is not
canonical (it is written as round/2).

Coordinators write ``gradstore/round/4``: every input has a ``codec`` (null when dense)
and carries its peer's own word, the announcement's ``sent_at`` and the peer's Ed25519
signature ``peer_sig`` over it, so an auditor checks each ``num_samples`` against what the
peer signed, not what the coordinator says. Round/4 also states the input-clipping norm
as a sequential float64 sum (docs/spec.md, section 6.2); round/2 and round/3 keep theirs.

An excluded input's CID is text, not a link: an input is often excluded because nobody
serves it, and a link would make the record's DAG incomplete, so pinning the record (or
fetching it whole) would wait on blocks that never come. Version 1 linked them.

``sig`` is the coordinator's Ed25519 signature over the DAG-CBOR encoding of
the same map without ``sig``. ``params`` holds JSON-like values only (str,
int, finite float, bool, null, lists, string-keyed maps).

A stepped job's rounds are written as step records (``messages.step_record``) linked by
a ``gradstore/round/5`` record (``messages.stepped_record``); the pieces every record
shares (inputs, exclusions, params, signing) are in ``messages.record_parts``.
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
    RecordExclusion,
    RecordInput,
    canonical_exclusions,
    canonical_inputs,
    check_link,
    check_params_map,
    check_prev,
    check_round_of,
    check_signed,
    check_sorted,
    check_type,
    exclusions_from_node,
    exclusions_node,
    inputs_from_node,
    inputs_node,
    open_node,
    prev_from_node,
    sign_node,
)
from .schema import check_did, check_text

__all__ = [
    "MAX_RECORD_BYTES",
    "RECORD_TYPE",
    "RECORD_TYPES",
    "RECORD_TYPE_CODECS",
    "RECORD_TYPE_SIGNED",
    "RecordExclusion",
    "RecordInput",
    "RoundRecord",
    "aggregate_meta",
    "decode_record",
    "encode_record",
]

RECORD_TYPE: Final = "gradstore/round/2"
#: The type of a record with at least one compressed input (``codec`` in every input).
RECORD_TYPE_CODECS: Final = "gradstore/round/3"
#: The type coordinators write: peers' signed announcements in every input (``peer_sig``).
RECORD_TYPE_SIGNED: Final = "gradstore/round/4"
RECORD_TYPES: Final = (RECORD_TYPE, RECORD_TYPE_CODECS, RECORD_TYPE_SIGNED)

_RECORD_KEYS: Final = frozenset(
    {
        "type",
        "job",
        "run",
        "round",
        "method",
        "params",
        "inputs",
        "excluded",
        "output",
        "prev",
        "coordinator",
        "sig",
    }
)


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """The unsigned content of a round record; ``encode_record`` signs it as ``coordinator``."""

    job: str
    run: str
    round: int
    method: str
    params: dict[str, Any]
    inputs: tuple[RecordInput, ...]
    excluded: tuple[RecordExclusion, ...]
    output: CID
    prev: CID | None
    coordinator: str

    def __post_init__(self) -> None:
        check_round_of(self.job, self.run, self.round)
        check_text("method", self.method)
        _set(self, "params", check_params_map(self.params))
        _set(self, "inputs", canonical_inputs(self.inputs))
        _set(self, "excluded", canonical_exclusions(self.excluded))
        check_link("output", self.output)
        check_prev(self.prev)
        check_did("coordinator", self.coordinator)

    @property
    def type(self) -> str:
        """The record's ``type``: round/4 when its inputs carry peers' signatures, else the
        round/2 or round/3 it was written as."""
        if self.inputs and self.inputs[0].peer_sig is not None:
            return RECORD_TYPE_SIGNED
        if any(i.codec is not None for i in self.inputs):
            return RECORD_TYPE_CODECS
        return RECORD_TYPE

    @property
    def step(self) -> None:
        """A round record names no step (its peers' announcements carry none)."""
        return None


def _unsigned_node(rec: RoundRecord) -> dict[str, Any]:
    kind = rec.type
    return {
        "type": kind,
        "job": rec.job,
        "run": rec.run,
        "round": rec.round,
        "method": rec.method,
        "params": rec.params,
        "inputs": inputs_node(
            rec.inputs, codecs=kind != RECORD_TYPE, signed=kind == RECORD_TYPE_SIGNED
        ),
        "excluded": exclusions_node(rec.excluded),
        "output": rec.output,
        "prev": rec.prev,
        "coordinator": rec.coordinator,
    }


def encode_record(rec: RoundRecord, key: SigningKey) -> tuple[CID, bytes]:
    """The signed DAG-CBOR bytes of ``rec`` and their CID (dag-cbor, sha2-256).

    ``key`` must be the coordinator's (``rec.coordinator``).
    """
    return sign_node(_unsigned_node(rec), rec.coordinator, key, "round record")


def decode_record(
    data: bytes, *, cid: CID | None = None, max_bytes: int = MAX_RECORD_BYTES
) -> RoundRecord:
    """Check ``data`` against ``cid`` (IntegrityError), its schema and the coordinator's signature.

    Refusals: ``IntegrityError`` for a hash mismatch, ``MessageError`` with
    reason too-large, malformed or bad-signature otherwise. A round/5 or step record is
    refused here (``decode_stepped_record``, ``decode_step_record`` read them).
    """
    node, sig = open_node(data, cid, max_bytes, _RECORD_KEYS, "round record")
    check_type(node, *RECORD_TYPES)
    rec = _record_from_node(node)
    check_signed(node, _unsigned_node(rec), rec.coordinator, sig, "round record")
    return rec


def _record_from_node(node: dict[str, Any]) -> RoundRecord:
    kind = node["type"]
    signed = kind == RECORD_TYPE_SIGNED
    inputs = inputs_from_node(node["inputs"], codecs=kind != RECORD_TYPE, signed=signed)
    excluded = exclusions_from_node(node["excluded"])
    if signed and not inputs:
        raise MessageError(Reason.MALFORMED, f"a {RECORD_TYPE_SIGNED} record lists no input")
    if kind == RECORD_TYPE_CODECS and all(i.codec is None for i in inputs):
        raise MessageError(
            Reason.MALFORMED, f"a {RECORD_TYPE_CODECS} record names no codec (write {RECORD_TYPE})"
        )
    rec = RoundRecord(
        job=node["job"],
        run=node["run"],
        round=node["round"],
        method=node["method"],
        params=node["params"],
        inputs=tuple(inputs),
        excluded=tuple(excluded),
        output=check_link("output", node["output"]),
        prev=prev_from_node(node),
        coordinator=node["coordinator"],
    )
    check_sorted(rec, inputs, excluded)
    return rec


def aggregate_meta(
    job: str, round_: int, method: str, inputs: Sequence[CID], *, run: str
) -> dict[str, Any]:
    """The meta of a round's aggregate document: what anyone re-deriving the output CID writes.

    ``inputs`` are the input gradients' CIDs in canonical order (sorted by peer id), written
    as base32 CIDv1 strings whatever form the peers announced.
    """
    return {
        "kind": "aggregate",
        "job": job,
        "run": run,
        "round": round_,
        "method": method,
        "inputs": [str(c.to_v1()) for c in inputs],
    }
