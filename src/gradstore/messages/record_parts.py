"""What every signed record shares: its inputs and exclusions, params, links, keys and signature.

A round record (round/2-4) and a step record (step/1) list the same ``inputs`` and
``excluded`` entries and ``params``; a stepped round record (round/5) links step records.
All of them are DAG-CBOR nodes signed by the coordinator over the node without ``sig``.
This module holds those shared pieces so each record type's module only states its node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Final, Protocol

from ..dag import cbor
from ..dag.cid import CID, DAG_CBOR, verify_block
from ..errors import CIDError, DAGError, FormatError, MessageError, Reason
from ..format import Codec
from .didkey import SIGNATURE_LEN, verify_signature
from .keys import SigningKey
from .schema import Announce, check_did, check_job, check_run, check_text, check_uint
from .signing import announcement_signed

# A record costs ~200 bytes per input; 4 MiB is ~20k peers, far beyond any job.
MAX_RECORD_BYTES: Final = 4 * 1024 * 1024
_MAX_PARAMS_DEPTH: Final = 16

INPUT_KEYS: Final = frozenset({"peer", "gradient", "num_samples", "weight"})
INPUT_KEYS_CODECS: Final = INPUT_KEYS | {"codec"}
INPUT_KEYS_SIGNED: Final = INPUT_KEYS_CODECS | {"sent_at", "peer_sig"}
_EXCLUSION_KEYS: Final = frozenset({"peer", "cid", "reason"})


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def check_link(name: str, value: object) -> CID:
    """``value`` if it is a CID (a DAG-CBOR link), else MessageError("malformed")."""
    if not isinstance(value, CID):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a CID, got {type(value).__name__}")
    return value


def check_round_of(job: str, run: str, round_: int) -> None:
    """MessageError("malformed") unless ``job``, ``run`` and ``round_`` name a round."""
    check_job("job", job)
    check_run("run", run)
    check_uint("round", round_)


def check_prev(prev: CID | None) -> None:
    """MessageError("malformed") unless ``prev`` is None or a link to a dag-cbor record."""
    if prev is not None and check_link("prev", prev).codec != DAG_CBOR:
        raise MessageError(Reason.MALFORMED, "`prev` must link to a dag-cbor round record")


def prev_from_node(node: dict[str, Any]) -> CID | None:
    """A decoded node's ``prev``: None, or a link (else MessageError("malformed"))."""
    prev = node["prev"]
    return None if prev is None else check_link("prev", prev)


def check_params_map(value: object) -> Any:
    """:func:`check_params` of ``value``, which must be a map (a record's ``params``)."""
    if not isinstance(value, Mapping):
        raise MessageError(Reason.MALFORMED, "`params` must be a map")
    return check_params(value)


def check_params(value: object, path: str = "params", depth: int = 0) -> Any:
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
        return [check_params(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise MessageError(
                    Reason.MALFORMED, f"`{path}` keys must be strings, got {k!r:.40}"
                )
            out[k] = check_params(v, f"{path}.{k}", depth + 1)
        return out
    raise MessageError(
        Reason.MALFORMED, f"`{path}`: {type(value).__name__} is not a JSON-like value"
    )


class AnnouncedIn(Protocol):
    """What a record states about the announcements it carries: job, run, round and step."""

    @property
    def job(self) -> str: ...
    @property
    def run(self) -> str: ...
    @property
    def round(self) -> int: ...
    @property
    def step(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class RecordInput:
    """One aggregated gradient: who sent it, its CID, its sample count, its weight, its
    document's codec (None for a dense gradstore/1 document) and, in round/4 and step/1, the
    peer's signed announcement of it (``sent_at`` and the peer's signature ``peer_sig``)."""

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
        check_link("inputs.gradient", self.gradient)
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

    def announcement(self, record: AnnouncedIn) -> Announce:
        """The announcement the peer signed for this input (``peer_sig`` covers its fields),
        with the record's step when it is a step record."""
        if self.sent_at is None:
            raise MessageError(Reason.MALFORMED, "this input carries no signed announcement")
        return Announce(
            job=record.job,
            run=record.run,
            round=record.round,
            step=record.step,
            peer=self.peer,
            cid=str(self.gradient.to_v1()),
            num_samples=self.num_samples,
            sent_at=self.sent_at,
        )

    def peer_signed(self, record: AnnouncedIn) -> bool:
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
            check_link("excluded.cid", self.cid)
            _set(self, "cid", self.cid.to_v1())

    def sort_key(self) -> tuple[str, bytes, str]:
        return (self.peer, b"" if self.cid is None else self.cid.bytes, self.reason)


class Listing(Protocol):
    """A record that lists inputs and exclusions (round/2-4, step/1, partial/1)."""

    @property
    def inputs(self) -> tuple[RecordInput, ...]: ...
    @property
    def excluded(self) -> tuple[RecordExclusion, ...]: ...


def check_sorted(rec: Listing, inputs: list[RecordInput], excluded: list[RecordExclusion]) -> None:
    """MessageError("malformed") unless the decoded ``inputs`` and ``excluded`` are in
    ``rec``'s (canonical) order."""
    if list(rec.inputs) != inputs or list(rec.excluded) != excluded:
        raise MessageError(Reason.MALFORMED, "`inputs` and `excluded` must be sorted by peer")


def typed(items: object, cls: type[Any], name: str) -> list[Any]:
    """``items`` as a list whose every item is a ``cls``, or MessageError."""
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a sequence of {cls.__name__}")
    out = list(items)
    for i, item in enumerate(out):
        if not isinstance(item, cls):
            raise MessageError(Reason.MALFORMED, f"`{name}[{i}]` must be a {cls.__name__}")
    return out


def canonical_inputs(items: object) -> tuple[RecordInput, ...]:
    """The inputs in record order (sorted by peer): no peer twice, ``peer_sig`` on all or none."""
    inputs = tuple(sorted(typed(items, RecordInput, "inputs"), key=lambda i: i.peer))
    if any(a.peer == b.peer for a, b in pairwise(inputs)):
        raise MessageError(Reason.MALFORMED, "`inputs` lists a peer twice")
    signed = [i.peer_sig is not None for i in inputs]
    if any(signed) and not all(signed):
        raise MessageError(Reason.MALFORMED, "either every input carries `peer_sig` or none does")
    return inputs


def canonical_exclusions(items: object) -> tuple[RecordExclusion, ...]:
    """The exclusions sorted by (peer, binary CID or empty, reason), none twice."""
    excluded = tuple(
        sorted(typed(items, RecordExclusion, "excluded"), key=RecordExclusion.sort_key)
    )
    if any(a == b for a, b in pairwise(excluded)):
        raise MessageError(Reason.MALFORMED, "`excluded` lists the same exclusion twice")
    return excluded


def inputs_node(
    inputs: Iterable[RecordInput], *, codecs: bool, signed: bool
) -> list[dict[str, Any]]:
    """The ``inputs`` array: round/2 keys, plus ``codec`` (round/3 on), plus the peer's word."""
    out = []
    for i in inputs:
        item: dict[str, Any] = {
            "peer": i.peer,
            "gradient": i.gradient,
            "num_samples": i.num_samples,
            "weight": i.weight,
        }
        if codecs:
            item["codec"] = None if i.codec is None else i.codec.fields()
        if signed:
            item["sent_at"] = i.sent_at
            item["peer_sig"] = i.peer_sig
        out.append(item)
    return out


def exclusions_node(excluded: Iterable[RecordExclusion]) -> list[dict[str, Any]]:
    """The ``excluded`` array; an exclusion's CID is text (its block may never be served)."""
    out = []
    for ex in excluded:
        entry: dict[str, Any] = {"peer": ex.peer, "reason": ex.reason}
        if ex.cid is not None:
            entry["cid"] = str(ex.cid)
        out.append(entry)
    return out


def exact_keys(
    name: str, node: object, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """``node`` if it is a map with every ``required`` key and no key beyond ``optional``."""
    if not isinstance(node, dict):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a map")
    keys = set(node)
    if not required <= keys or not keys <= required | optional:
        raise MessageError(
            Reason.MALFORMED, f"`{name}` has keys {sorted(keys)}, expected {sorted(required)}"
        )
    return node


def check_outcome(
    array: str,
    kind: str,
    name: str,
    record: CID | None,
    output: CID | None,
    failed: str | None,
    linked: str,
) -> None:
    """MessageError("malformed") unless the entry of ``kind`` ``name`` in ``array`` (a
    round/5's steps, a tree's groups) either failed (a reason, no links) or closed: a link
    to its dag-cbor ``linked`` record and one to its output."""
    if failed is not None:
        check_text(f"{array}.failed", failed)
        if record is not None or output is not None:
            raise MessageError(
                Reason.MALFORMED, f"failed {kind} {name!r} has no `record` or `output`"
            )
        return
    if record is None or output is None:
        raise MessageError(
            Reason.MALFORMED, f"{kind} {name!r} needs a `record` and an `output`, or `failed`"
        )
    if check_link(f"{array}.record", record).codec != DAG_CBOR:
        raise MessageError(Reason.MALFORMED, f"`{array}.record` must link to a dag-cbor {linked}")
    check_link(f"{array}.output", output)


def entries_from_node(
    name: str,
    node: object,
    closed: frozenset[str],
    failed: frozenset[str],
    optional: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """The maps of a ``name`` array (a round/5's steps, a tree's groups): each with either
    the ``closed`` keys or the ``failed`` keys, and any of the ``optional`` ones."""
    if not isinstance(node, list):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be an array")
    entries = []
    for i, item in enumerate(node):
        entry = exact_keys(f"{name}[{i}]", item, closed & failed, closed | failed | optional)
        if set(entry) - optional not in (closed, failed):
            raise MessageError(
                Reason.MALFORMED,
                f"`{name}[{i}]` has keys {sorted(entry)}: either record and output, or failed",
            )
        entries.append(entry)
    return entries


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


def inputs_from_node(node: object, *, codecs: bool, signed: bool) -> list[RecordInput]:
    """The inputs of an ``inputs`` array, in the order given (the caller checks the order)."""
    if not isinstance(node, list):
        raise MessageError(Reason.MALFORMED, "`inputs` must be an array")
    keys = INPUT_KEYS_SIGNED if signed else INPUT_KEYS_CODECS if codecs else INPUT_KEYS
    inputs = []
    for i, item in enumerate(node):
        entry = exact_keys(f"inputs[{i}]", item, keys)
        if not isinstance(entry["weight"], float):
            raise MessageError(Reason.MALFORMED, f"`inputs[{i}].weight` must be a float")
        inputs.append(
            RecordInput(
                peer=entry["peer"],
                gradient=check_link(f"inputs[{i}].gradient", entry["gradient"]),
                num_samples=entry["num_samples"],
                weight=entry["weight"],
                codec=_codec(f"inputs[{i}].codec", entry["codec"]) if codecs else None,
                sent_at=entry["sent_at"] if signed else None,
                peer_sig=entry["peer_sig"] if signed else None,
            )
        )
    return inputs


def exclusions_from_node(node: object) -> list[RecordExclusion]:
    """The exclusions of an ``excluded`` array, in the order given."""
    if not isinstance(node, list):
        raise MessageError(Reason.MALFORMED, "`excluded` must be an array")
    excluded = []
    for i, item in enumerate(node):
        entry = exact_keys(f"excluded[{i}]", item, _EXCLUSION_KEYS - {"cid"}, frozenset({"cid"}))
        excluded.append(
            RecordExclusion(
                peer=entry["peer"],
                reason=entry["reason"],
                cid=_cid_text(f"excluded[{i}].cid", entry["cid"]) if "cid" in entry else None,
            )
        )
    return excluded


def dag_cbor(node: dict[str, Any], what: str = "round record") -> bytes:
    """The DAG-CBOR bytes of ``node``; MessageError("malformed") if it cannot be encoded."""
    try:
        return cbor.encode(node)
    except DAGError as exc:
        raise MessageError(Reason.MALFORMED, f"cannot encode the {what}: {exc}") from None


def sign_node(
    node: dict[str, Any], coordinator: str, key: SigningKey, what: str
) -> tuple[CID, bytes]:
    """The signed DAG-CBOR bytes of ``node`` (``sig`` added) and their CID; ``key`` must be
    ``coordinator``'s."""
    if key.did != coordinator:
        raise MessageError(
            Reason.NOT_COORDINATOR,
            f"a {what} of coordinator {coordinator} cannot be signed by {key.did}",
        )
    node = {**node, "sig": key.sign(dag_cbor(node, what))}
    data = dag_cbor(node, what)
    return CID.hash(DAG_CBOR, data), data


def open_node(
    data: bytes, cid: CID | None, max_bytes: int, keys: frozenset[str], what: str
) -> tuple[dict[str, Any], bytes]:
    """A record's node without ``sig``, and ``sig``: hash, size, DAG-CBOR and keys checked.

    ``IntegrityError`` when ``data`` is not ``cid``'s block; ``MessageError`` too-large or
    malformed otherwise. The signature is the caller's to check, over :func:`dag_cbor` of
    the node it rebuilds from the decoded record (so the record is also canonical).
    """
    if cid is not None:
        if cid.codec != DAG_CBOR:
            raise CIDError(f"a {what}'s CID is dag-cbor, got {cid.codec_name} ({cid})")
        verify_block(cid, data)
    if len(data) > max_bytes:
        raise MessageError(
            Reason.TOO_LARGE, f"{what} is {len(data)} bytes, the limit is {max_bytes}"
        )
    try:
        node = cbor.decode(data)
    except DAGError as exc:
        raise MessageError(Reason.MALFORMED, str(exc)) from None
    node = exact_keys("record", node, keys)
    sig = node.pop("sig")
    if not isinstance(sig, bytes) or len(sig) != SIGNATURE_LEN:
        raise MessageError(Reason.MALFORMED, f"`sig` must be {SIGNATURE_LEN} bytes")
    return node, sig


def check_type(node: dict[str, Any], *types: str) -> None:
    """MessageError("malformed") unless the decoded ``node``'s ``type`` is one of ``types``."""
    kind = node["type"]
    if kind not in types:
        raise MessageError(Reason.MALFORMED, f"not a {', '.join(types)} node (type {kind!r:.40})")


def check_signed(
    node: dict[str, Any], canonical: dict[str, Any], coordinator: str, sig: bytes, what: str
) -> None:
    """MessageError unless ``node`` (as decoded) is ``canonical`` (as rebuilt) byte for byte
    and ``sig`` is ``coordinator``'s over it."""
    unsigned = dag_cbor(node, what)
    if dag_cbor(canonical, what) != unsigned:
        raise MessageError(
            Reason.MALFORMED, f"{what} is not in canonical form (order, int or float types)"
        )
    if not verify_signature(coordinator, unsigned, sig):
        raise MessageError(
            Reason.BAD_SIGNATURE, f"{what} is not signed by its coordinator {coordinator}"
        )
