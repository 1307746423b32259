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
as a sequential float64 sum (docs/audit.md); round/2 and round/3 keep theirs.

An excluded input's CID is text, not a link: an input is often excluded because nobody
serves it, and a link would make the record's DAG incomplete, so pinning the record (or
fetching it whole) would wait on blocks that never come. Version 1 linked them.

``sig`` is the coordinator's Ed25519 signature over the DAG-CBOR encoding of
the same map without ``sig``. ``params`` holds JSON-like values only (str,
int, finite float, bool, null, lists, string-keyed maps).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Final

from ..dag import cbor
from ..dag.cid import CID, DAG_CBOR, verify_block
from ..errors import CIDError, DAGError, FormatError, MessageError, Reason
from ..format import Codec
from .didkey import SIGNATURE_LEN, verify_signature
from .keys import SigningKey
from .schema import Announce, check_did, check_job, check_run, check_text, check_uint
from .signing import announcement_signed

RECORD_TYPE: Final = "gradstore/round/2"
#: The type of a record with at least one compressed input (``codec`` in every input).
RECORD_TYPE_CODECS: Final = "gradstore/round/3"
#: The type coordinators write: peers' signed announcements in every input (``peer_sig``).
RECORD_TYPE_SIGNED: Final = "gradstore/round/4"
RECORD_TYPES: Final = (RECORD_TYPE, RECORD_TYPE_CODECS, RECORD_TYPE_SIGNED)
# A record costs ~200 bytes per input; 4 MiB is ~20k peers, far beyond any job.
MAX_RECORD_BYTES: Final = 4 * 1024 * 1024
_MAX_PARAMS_DEPTH: Final = 16

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
_INPUT_KEYS: Final = frozenset({"peer", "gradient", "num_samples", "weight"})
_INPUT_KEYS_CODECS: Final = _INPUT_KEYS | {"codec"}
_INPUT_KEYS_SIGNED: Final = _INPUT_KEYS_CODECS | {"sent_at", "peer_sig"}
_EXCLUSION_KEYS: Final = frozenset({"peer", "cid", "reason"})


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def _check_link(name: str, value: object) -> CID:
    if not isinstance(value, CID):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a CID, got {type(value).__name__}")
    return value


def _check_params(value: object, path: str = "params", depth: int = 0) -> Any:
    """A deep copy of JSON-like ``value`` (lists for tuples), or MessageError."""
    if depth > _MAX_PARAMS_DEPTH:
        raise MessageError(Reason.MALFORMED, f"`{path}` nests too deep")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not -(2**64) <= value < 2**64:  # the CBOR integer range
            raise MessageError(Reason.MALFORMED, f"`{path}` does not fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MessageError(Reason.MALFORMED, f"`{path}` must be finite, got {value!r}")
        return value
    if isinstance(value, list | tuple):
        return [_check_params(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise MessageError(
                    Reason.MALFORMED, f"`{path}` keys must be strings, got {k!r:.40}"
                )
            out[k] = _check_params(v, f"{path}.{k}", depth + 1)
        return out
    raise MessageError(
        Reason.MALFORMED, f"`{path}`: {type(value).__name__} is not a JSON-like value"
    )


@dataclass(frozen=True, slots=True)
class RecordInput:
    """One aggregated gradient: who sent it, its CID, its sample count, its weight, its
    document's codec (None for a dense gradstore/1 document) and, in round/4, the peer's
    signed announcement of it (``sent_at`` and the peer's signature ``peer_sig``)."""

    peer: str
    gradient: CID
    num_samples: int
    weight: float
    codec: Codec | None = None
    sent_at: int | None = None
    peer_sig: bytes | None = None

    def __post_init__(self) -> None:
        if self.codec is not None and not isinstance(self.codec, Codec):
            raise MessageError(Reason.MALFORMED, "`inputs.codec` must be a Codec or None")
        check_did("inputs.peer", self.peer)
        _check_link("inputs.gradient", self.gradient)
        check_uint("inputs.num_samples", self.num_samples)
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
            raise MessageError(
                Reason.MALFORMED, f"`inputs.weight` must be a finite number, got {w!r}"
            )
        _set(self, "weight", float(w))
        if (self.sent_at is None) != (self.peer_sig is None):
            raise MessageError(
                Reason.MALFORMED, "`inputs.sent_at` and `inputs.peer_sig` go together"
            )
        if self.sent_at is not None:
            check_uint("inputs.sent_at", self.sent_at)
        if self.peer_sig is not None and (
            not isinstance(self.peer_sig, bytes) or len(self.peer_sig) != SIGNATURE_LEN
        ):
            raise MessageError(Reason.MALFORMED, f"`inputs.peer_sig` must be {SIGNATURE_LEN} bytes")

    def announcement(self, record: RoundRecord) -> Announce:
        """The announcement the peer signed for this input (``peer_sig`` covers its fields)."""
        if self.sent_at is None:
            raise MessageError(Reason.MALFORMED, "this input carries no signed announcement")
        return Announce(
            job=record.job,
            run=record.run,
            round=record.round,
            peer=self.peer,
            cid=str(self.gradient.to_v1()),
            num_samples=self.num_samples,
            sent_at=self.sent_at,
        )

    def peer_signed(self, record: RoundRecord) -> bool:
        """Whether ``peer_sig`` is the peer's signature over :meth:`announcement`."""
        if self.peer_sig is None:
            return False
        return announcement_signed(self.announcement(record), self.peer_sig)


@dataclass(frozen=True, slots=True)
class RecordExclusion:
    """A peer's announcement that was not aggregated, and why (e.g. "timeout", "bad-schema")."""

    peer: str
    reason: str
    cid: CID | None = None

    def __post_init__(self) -> None:
        check_did("excluded.peer", self.peer)
        check_text("excluded.reason", self.reason)
        if self.cid is not None:
            _check_link("excluded.cid", self.cid)
            _set(self, "cid", self.cid.to_v1())

    def sort_key(self) -> tuple[str, bytes, str]:
        return (self.peer, b"" if self.cid is None else self.cid.bytes, self.reason)


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
        check_job("job", self.job)
        check_run("run", self.run)
        check_uint("round", self.round)
        check_text("method", self.method)
        if not isinstance(self.params, Mapping):
            raise MessageError(Reason.MALFORMED, "`params` must be a map")
        _set(self, "params", _check_params(self.params))
        inputs = tuple(sorted(_typed(self.inputs, RecordInput, "inputs"), key=lambda i: i.peer))
        if any(a.peer == b.peer for a, b in pairwise(inputs)):
            raise MessageError(Reason.MALFORMED, "`inputs` lists a peer twice")
        excluded = tuple(
            sorted(_typed(self.excluded, RecordExclusion, "excluded"), key=RecordExclusion.sort_key)
        )
        if any(a == b for a, b in pairwise(excluded)):
            raise MessageError(Reason.MALFORMED, "`excluded` lists the same exclusion twice")
        _set(self, "inputs", inputs)
        _set(self, "excluded", excluded)
        _check_link("output", self.output)
        if self.prev is not None and _check_link("prev", self.prev).codec != DAG_CBOR:
            raise MessageError(Reason.MALFORMED, "`prev` must link to a dag-cbor round record")
        check_did("coordinator", self.coordinator)
        signed = [i.peer_sig is not None for i in inputs]
        if any(signed) and not all(signed):
            raise MessageError(
                Reason.MALFORMED, "either every input carries `peer_sig` or none does"
            )

    @property
    def type(self) -> str:
        """The record's ``type``: round/4 when its inputs carry peers' signatures, else the
        round/2 or round/3 it was written as."""
        if self.inputs and self.inputs[0].peer_sig is not None:
            return RECORD_TYPE_SIGNED
        if any(i.codec is not None for i in self.inputs):
            return RECORD_TYPE_CODECS
        return RECORD_TYPE


def _typed(items: object, cls: type[Any], name: str) -> list[Any]:
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a sequence of {cls.__name__}")
    out = list(items)
    for i, item in enumerate(out):
        if not isinstance(item, cls):
            raise MessageError(Reason.MALFORMED, f"`{name}[{i}]` must be a {cls.__name__}")
    return out


def _cid_text(name: str, value: object) -> CID:
    if not isinstance(value, str):
        raise MessageError(
            Reason.MALFORMED, f"`{name}` must be a CID string, got {type(value).__name__}"
        )
    try:
        return CID.parse(value)
    except CIDError as exc:
        raise MessageError(Reason.MALFORMED, f"`{name}`: {exc}") from None


def _codec(name: str, value: object) -> Codec | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a codec map or null")
    try:
        return Codec.from_fields(value)
    except (FormatError, TypeError) as exc:
        raise MessageError(Reason.MALFORMED, f"`{name}`: {exc}") from None


def _unsigned_node(rec: RoundRecord) -> dict[str, Any]:
    kind = rec.type
    codecs = kind != RECORD_TYPE
    excluded = []
    for ex in rec.excluded:
        entry: dict[str, Any] = {"peer": ex.peer, "reason": ex.reason}
        if ex.cid is not None:
            entry["cid"] = str(ex.cid)
        excluded.append(entry)
    inputs = []
    for i in rec.inputs:
        item: dict[str, Any] = {
            "peer": i.peer,
            "gradient": i.gradient,
            "num_samples": i.num_samples,
            "weight": i.weight,
        }
        if codecs:
            item["codec"] = None if i.codec is None else i.codec.fields()
        if kind == RECORD_TYPE_SIGNED:
            item["sent_at"] = i.sent_at
            item["peer_sig"] = i.peer_sig
        inputs.append(item)
    return {
        "type": kind,
        "job": rec.job,
        "run": rec.run,
        "round": rec.round,
        "method": rec.method,
        "params": rec.params,
        "inputs": inputs,
        "excluded": excluded,
        "output": rec.output,
        "prev": rec.prev,
        "coordinator": rec.coordinator,
    }


def _dag_cbor(node: dict[str, Any]) -> bytes:
    try:
        return cbor.encode(node)
    except DAGError as exc:
        raise MessageError(Reason.MALFORMED, f"cannot encode the round record: {exc}") from None


def encode_record(rec: RoundRecord, key: SigningKey) -> tuple[CID, bytes]:
    """The signed DAG-CBOR bytes of ``rec`` and their CID (dag-cbor, sha2-256).

    ``key`` must be the coordinator's (``rec.coordinator``).
    """
    if key.did != rec.coordinator:
        raise MessageError(
            Reason.NOT_COORDINATOR,
            f"a record of coordinator {rec.coordinator} cannot be signed by {key.did}",
        )
    node = _unsigned_node(rec)
    node["sig"] = key.sign(_dag_cbor(node))
    data = _dag_cbor(node)
    return CID.hash(DAG_CBOR, data), data


def _exact_keys(
    name: str, node: object, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a map")
    keys = set(node)
    if not required <= keys or not keys <= required | optional:
        raise MessageError(
            Reason.MALFORMED, f"`{name}` has keys {sorted(keys)}, expected {sorted(required)}"
        )
    return node


def decode_record(
    data: bytes, *, cid: CID | None = None, max_bytes: int = MAX_RECORD_BYTES
) -> RoundRecord:
    """Check ``data`` against ``cid`` (IntegrityError), its schema and the coordinator's signature.

    Refusals: ``IntegrityError`` for a hash mismatch, ``MessageError`` with
    reason too-large, malformed or bad-signature otherwise.
    """
    if cid is not None:
        if cid.codec != DAG_CBOR:
            raise CIDError(f"a round record's CID is dag-cbor, got {cid.codec_name} ({cid})")
        verify_block(cid, data)
    if len(data) > max_bytes:
        raise MessageError(
            Reason.TOO_LARGE, f"round record is {len(data)} bytes, the limit is {max_bytes}"
        )
    try:
        node = cbor.decode(data)
    except DAGError as exc:
        raise MessageError(Reason.MALFORMED, str(exc)) from None
    node = _exact_keys("record", node, _RECORD_KEYS)
    if node["type"] not in RECORD_TYPES:
        raise MessageError(
            Reason.MALFORMED,
            f"not a {', '.join(RECORD_TYPES)} node (type {node['type']!r:.40})",
        )
    sig = node.pop("sig")
    if not isinstance(sig, bytes) or len(sig) != SIGNATURE_LEN:
        raise MessageError(Reason.MALFORMED, f"`sig` must be {SIGNATURE_LEN} bytes")
    rec = _record_from_node(node)
    unsigned = _dag_cbor(node)
    if _dag_cbor(_unsigned_node(rec)) != unsigned:
        raise MessageError(
            Reason.MALFORMED, "round record is not in canonical form (order, int or float types)"
        )
    if not verify_signature(rec.coordinator, unsigned, sig):
        raise MessageError(
            Reason.BAD_SIGNATURE, f"round record is not signed by its coordinator {rec.coordinator}"
        )
    return rec


def _record_from_node(node: dict[str, Any]) -> RoundRecord:
    inputs_node = node["inputs"]
    excluded_node = node["excluded"]
    if not isinstance(inputs_node, list) or not isinstance(excluded_node, list):
        raise MessageError(Reason.MALFORMED, "`inputs` and `excluded` must be arrays")
    kind = node["type"]
    codecs = kind != RECORD_TYPE
    signed = kind == RECORD_TYPE_SIGNED
    keys = _INPUT_KEYS_SIGNED if signed else _INPUT_KEYS_CODECS if codecs else _INPUT_KEYS
    inputs = []
    for i, item in enumerate(inputs_node):
        entry = _exact_keys(f"inputs[{i}]", item, keys)
        if not isinstance(entry["weight"], float):
            raise MessageError(Reason.MALFORMED, f"`inputs[{i}].weight` must be a float")
        inputs.append(
            RecordInput(
                peer=entry["peer"],
                gradient=_check_link(f"inputs[{i}].gradient", entry["gradient"]),
                num_samples=entry["num_samples"],
                weight=entry["weight"],
                codec=_codec(f"inputs[{i}].codec", entry["codec"]) if codecs else None,
                sent_at=entry["sent_at"] if signed else None,
                peer_sig=entry["peer_sig"] if signed else None,
            )
        )
    if signed and not inputs:
        raise MessageError(Reason.MALFORMED, f"a {RECORD_TYPE_SIGNED} record lists no input")
    if kind == RECORD_TYPE_CODECS and all(i.codec is None for i in inputs):
        raise MessageError(
            Reason.MALFORMED, f"a {RECORD_TYPE_CODECS} record names no codec (write {RECORD_TYPE})"
        )
    excluded = []
    for i, item in enumerate(excluded_node):
        entry = _exact_keys(f"excluded[{i}]", item, _EXCLUSION_KEYS - {"cid"}, frozenset({"cid"}))
        excluded.append(
            RecordExclusion(
                peer=entry["peer"],
                reason=entry["reason"],
                cid=_cid_text(f"excluded[{i}].cid", entry["cid"]) if "cid" in entry else None,
            )
        )
    prev = node["prev"]
    rec = RoundRecord(
        job=node["job"],
        run=node["run"],
        round=node["round"],
        method=node["method"],
        params=node["params"],
        inputs=tuple(inputs),
        excluded=tuple(excluded),
        output=_check_link("output", node["output"]),
        prev=None if prev is None else _check_link("prev", prev),
        coordinator=node["coordinator"],
    )
    if list(rec.inputs) != inputs or list(rec.excluded) != excluded:
        raise MessageError(Reason.MALFORMED, "`inputs` and `excluded` must be sorted by peer")
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
