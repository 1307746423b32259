"""The signed records of a tree round (docs/design/multicoord.md, "The tree by peer groups").

A leaf coordinator signs what its group aggregated, ``gradstore/partial/1``: a round/4
record's inputs (each with its peer's signed announcement), exclusions, method and params,
the group's name, no ``prev``, and as ``output`` the group's partial document (the exact
partial sums, docs/spec.md section 9.5)::

    {type: "gradstore/partial/1", job, run, round, group, method, params,
     inputs: [round/4 inputs], excluded, output: <link>, coordinator, sig}

The root signs the round, ``gradstore/tree/1``: every group of the job in the job's order,
each with its leaf and its partial record and partial document, or why it failed; the
combined output; the previous round's record::

    {type: "gradstore/tree/1", job, run, round, method, params,
     groups: [{group, coordinator, record: <link>, output: <link>}
              | {group, coordinator, failed: reason}, ...],
     output: <link>, prev: <link> | null, coordinator, sig}

``params`` are the method's over every aggregated input (all groups', sorted by peer), as a
flat round's record states them; at least one group closed (else the round has no record).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..dag.cid import CID
from ..errors import MessageError, Reason
from .keys import SigningKey
from .record import aggregate_meta
from .record_parts import (
    MAX_RECORD_BYTES,
    RecordExclusion,
    RecordInput,
    canonical_exclusions,
    canonical_inputs,
    check_link,
    check_outcome,
    check_params_map,
    check_prev,
    check_round_of,
    check_signed,
    check_sorted,
    check_type,
    entries_from_node,
    exclusions_from_node,
    exclusions_node,
    inputs_from_node,
    inputs_node,
    open_node,
    prev_from_node,
    sign_node,
    typed,
)
from .schema import check_did, check_step, check_text

PARTIAL_RECORD_TYPE: Final = "gradstore/partial/1"
TREE_RECORD_TYPE: Final = "gradstore/tree/1"
#: The ``kind`` in a partial document's meta.
PARTIAL_KIND: Final = "partial"

_PARTIAL_KEYS: Final = frozenset(
    {
        "type",
        "job",
        "run",
        "round",
        "group",
        "method",
        "params",
        "inputs",
        "excluded",
        "output",
        "coordinator",
        "sig",
    }
)
_TREE_KEYS: Final = frozenset(
    {
        "type",
        "job",
        "run",
        "round",
        "method",
        "params",
        "groups",
        "output",
        "prev",
        "coordinator",
        "sig",
    }
)
_CLOSED_KEYS: Final = frozenset({"group", "coordinator", "record", "output"})
_FAILED_KEYS: Final = frozenset({"group", "coordinator", "failed"})


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True, slots=True)
class PartialRecord:
    """The unsigned content of a leaf's partial record; ``encode_partial_record`` signs it
    as ``coordinator`` (the group's leaf)."""

    job: str
    run: str
    round: int
    group: str
    method: str
    params: dict[str, Any]
    inputs: tuple[RecordInput, ...]
    excluded: tuple[RecordExclusion, ...]
    output: CID
    coordinator: str

    def __post_init__(self) -> None:
        check_round_of(self.job, self.run, self.round)
        check_step("group", self.group)
        check_text("method", self.method)
        _set(self, "params", check_params_map(self.params))
        inputs = canonical_inputs(self.inputs)
        if not inputs or any(i.peer_sig is None for i in inputs):
            raise MessageError(
                Reason.MALFORMED, "a partial record lists at least one input, each with `peer_sig`"
            )
        _set(self, "inputs", inputs)
        _set(self, "excluded", canonical_exclusions(self.excluded))
        check_link("output", self.output)
        check_did("coordinator", self.coordinator)

    @property
    def type(self) -> str:
        return PARTIAL_RECORD_TYPE

    @property
    def step(self) -> None:
        """No step: a group's peers announce their whole gradient (``peer_sig`` covers none)."""
        return None


def _partial_node(rec: PartialRecord) -> dict[str, Any]:
    return {
        "type": PARTIAL_RECORD_TYPE,
        "job": rec.job,
        "run": rec.run,
        "round": rec.round,
        "group": rec.group,
        "method": rec.method,
        "params": rec.params,
        "inputs": inputs_node(rec.inputs, codecs=True, signed=True),
        "excluded": exclusions_node(rec.excluded),
        "output": rec.output,
        "coordinator": rec.coordinator,
    }


def encode_partial_record(rec: PartialRecord, key: SigningKey) -> tuple[CID, bytes]:
    """The signed DAG-CBOR bytes of ``rec`` and their CID; ``key`` must be the leaf's."""
    return sign_node(_partial_node(rec), rec.coordinator, key, "partial record")


def decode_partial_record(
    data: bytes, *, cid: CID | None = None, max_bytes: int = MAX_RECORD_BYTES
) -> PartialRecord:
    """Check ``data`` against ``cid`` (IntegrityError), its schema and the leaf's signature
    (MessageError: too-large, malformed, bad-signature)."""
    node, sig = open_node(data, cid, max_bytes, _PARTIAL_KEYS, "partial record")
    check_type(node, PARTIAL_RECORD_TYPE)
    inputs = inputs_from_node(node["inputs"], codecs=True, signed=True)
    excluded = exclusions_from_node(node["excluded"])
    rec = PartialRecord(
        job=node["job"],
        run=node["run"],
        round=node["round"],
        group=node["group"],
        method=node["method"],
        params=node["params"],
        inputs=tuple(inputs),
        excluded=tuple(excluded),
        output=check_link("output", node["output"]),
        coordinator=node["coordinator"],
    )
    check_sorted(rec, inputs, excluded)
    check_signed(node, _partial_node(rec), rec.coordinator, sig, "partial record")
    return rec


def partial_meta(
    job: str,
    round_: int,
    group: str,
    method: str,
    inputs: Sequence[CID],
    dtypes: Mapping[str, str],
    *,
    run: str,
) -> dict[str, Any]:
    """The meta of a group's partial document (docs/spec.md, section 9.5): a round's
    aggregate meta (its input CIDs in record order), ``kind`` "partial", the group, and
    ``dtypes``: each tensor's dtype in the inputs (the output's, once combined)."""
    meta = aggregate_meta(job, round_, method, inputs, run=run)
    return {**meta, "kind": PARTIAL_KIND, "group": group, "dtypes": dict(sorted(dtypes.items()))}


def record_partial_meta(record: PartialRecord, dtypes: Mapping[str, str]) -> dict[str, Any]:
    """:func:`partial_meta` of ``record`` (``dtypes``: its inputs'): what its ``output``'s
    meta must be."""
    return partial_meta(
        record.job,
        record.round,
        record.group,
        record.method,
        [i.gradient for i in record.inputs],
        dtypes,
        run=record.run,
    )


@dataclass(frozen=True, slots=True)
class TreeGroup:
    """One group of a tree round: its leaf, and its partial record and document, or why
    it failed (a leaf that was not heard: "no result from its coordinator <did>")."""

    group: str
    coordinator: str
    record: CID | None = None
    output: CID | None = None
    failed: str | None = None

    def __post_init__(self) -> None:
        check_step("groups.group", self.group)
        check_did("groups.coordinator", self.coordinator)
        check_outcome(
            "groups", "group", self.group, self.record, self.output, self.failed, "record"
        )


@dataclass(frozen=True, slots=True)
class TreeRecord:
    """The unsigned content of a tree round's record; ``encode_tree_record`` signs it as
    ``coordinator`` (the root)."""

    job: str
    run: str
    round: int
    method: str
    params: dict[str, Any]
    groups: tuple[TreeGroup, ...]
    output: CID
    prev: CID | None
    coordinator: str

    def __post_init__(self) -> None:
        check_round_of(self.job, self.run, self.round)
        check_text("method", self.method)
        _set(self, "params", check_params_map(self.params))
        groups = tuple(typed(self.groups, TreeGroup, "groups"))
        names = [g.group for g in groups]
        if len(set(names)) != len(names):
            raise MessageError(Reason.MALFORMED, "`groups` names a group twice")
        if all(g.failed is not None for g in groups):
            raise MessageError(Reason.MALFORMED, "a tree record has at least one closed group")
        _set(self, "groups", groups)
        check_link("output", self.output)
        check_prev(self.prev)
        check_did("coordinator", self.coordinator)

    @property
    def type(self) -> str:
        return TREE_RECORD_TYPE

    @property
    def step(self) -> None:
        return None


def _group_node(entry: TreeGroup) -> dict[str, Any]:
    if entry.failed is not None:
        return {"group": entry.group, "coordinator": entry.coordinator, "failed": entry.failed}
    return {
        "group": entry.group,
        "coordinator": entry.coordinator,
        "record": entry.record,
        "output": entry.output,
    }


def _tree_node(rec: TreeRecord) -> dict[str, Any]:
    return {
        "type": TREE_RECORD_TYPE,
        "job": rec.job,
        "run": rec.run,
        "round": rec.round,
        "method": rec.method,
        "params": rec.params,
        "groups": [_group_node(g) for g in rec.groups],
        "output": rec.output,
        "prev": rec.prev,
        "coordinator": rec.coordinator,
    }


def encode_tree_record(rec: TreeRecord, key: SigningKey) -> tuple[CID, bytes]:
    """The signed DAG-CBOR bytes of ``rec`` and their CID; ``key`` must be the root's."""
    return sign_node(_tree_node(rec), rec.coordinator, key, "round record")


def decode_tree_record(
    data: bytes, *, cid: CID | None = None, max_bytes: int = MAX_RECORD_BYTES
) -> TreeRecord:
    """Check ``data`` against ``cid`` (IntegrityError), its schema and the root's signature
    (MessageError: too-large, malformed, bad-signature)."""
    node, sig = open_node(data, cid, max_bytes, _TREE_KEYS, "round record")
    check_type(node, TREE_RECORD_TYPE)
    groups = [
        TreeGroup(
            group=entry["group"],
            coordinator=entry["coordinator"],
            record=entry.get("record"),
            output=entry.get("output"),
            failed=entry.get("failed"),
        )
        for entry in entries_from_node("groups", node["groups"], _CLOSED_KEYS, _FAILED_KEYS)
    ]
    rec = TreeRecord(
        job=node["job"],
        run=node["run"],
        round=node["round"],
        method=node["method"],
        params=node["params"],
        groups=tuple(groups),
        output=check_link("output", node["output"]),
        prev=prev_from_node(node),
        coordinator=node["coordinator"],
    )
    check_signed(node, _tree_node(rec), rec.coordinator, sig, "round record")
    return rec


def check_partial_of(
    record: TreeRecord, entry: TreeGroup, cid: CID, partial: PartialRecord
) -> None:
    """MessageError unless ``partial`` (the record ``cid`` names) is ``entry``'s: the group's,
    of the tree record's job, run and round, signed by the group's leaf, with its output."""
    said = (record.job, record.run, record.round, entry.group)
    got = (partial.job, partial.run, partial.round, partial.group)
    if got != said:
        raise MessageError(
            Reason.MALFORMED,
            f"partial record {cid} is job {got[0]!r} run {got[1]} round {got[2]} group "
            f"{got[3]!r}, the round says job {said[0]!r} run {said[1]} round {said[2]} group "
            f"{said[3]!r}",
        )
    if partial.coordinator != entry.coordinator:
        raise MessageError(
            Reason.NOT_COORDINATOR,
            f"group {entry.group!r}'s partial record {cid} is signed by {partial.coordinator}, "
            f"not by its leaf {entry.coordinator}",
        )
    if entry.output is None or partial.output.to_v1() != entry.output.to_v1():
        raise MessageError(
            Reason.MALFORMED,
            f"group {entry.group!r}'s partial output is {partial.output}, the round says "
            f"{entry.output}",
        )
