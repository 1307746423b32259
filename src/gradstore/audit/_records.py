"""Fetching the signed records an audit starts from: round records (round/2-5) and step records.

Each is one DAG-CBOR block: hashed against its CID, decoded strictly (canonical bytes,
exact keys) and its coordinator's signature checked, every failure an ``AuditError``
naming the check: ``record-cid``, ``record-fetch``, ``record-hash``, ``record-signature``,
``record-format``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias, TypeVar

from ..dag import CID, DAG_CBOR, cbor
from ..errors import (
    AuditError,
    CIDError,
    DAGError,
    IntegrityError,
    MessageError,
    NodeError,
    Reason,
)
from ..messages import (
    RECORD_TYPE_STEPPED,
    TREE_RECORD_TYPE,
    RoundRecord,
    SteppedRoundRecord,
    StepRecord,
    TreeRecord,
    decode_record,
    decode_step_record,
    decode_stepped_record,
    decode_tree_record,
)
from ..node import Node
from ._cid import parse_cid

T = TypeVar("T")
AnyRoundRecord: TypeAlias = RoundRecord | SteppedRoundRecord | TreeRecord
"""A round's record: round/2-4 (one aggregation), round/5 (a stepped round) or tree/1 (a
round combined from groups' partials)."""


async def _fetch(
    node: Node, cid: CID | str, what: str, decode: Callable[[bytes, CID], T]
) -> tuple[CID, T]:
    rcid = parse_cid(cid, "record-cid")
    if rcid.codec != DAG_CBOR:
        raise AuditError("record-cid", f"{rcid} is {rcid.codec_name}; a {what} is dag-cbor")
    try:
        data = await node.get_block(rcid)
    except IntegrityError as exc:  # the node served bytes that are not the record's
        raise AuditError("record-hash", f"{what} {rcid}: {exc}") from exc
    except NodeError as exc:
        raise AuditError("record-fetch", f"cannot fetch {what} {rcid}: {exc}") from exc
    try:
        return rcid, decode(data, rcid)
    except IntegrityError as exc:
        raise AuditError("record-hash", f"{what} {rcid}: {exc}") from exc
    except CIDError as exc:
        raise AuditError("record-cid", f"{what} {rcid}: {exc}") from exc
    except MessageError as exc:
        check = "record-signature" if exc.code is Reason.BAD_SIGNATURE else "record-format"
        raise AuditError(check, f"{what} {rcid}: {exc}") from exc


async def fetch_with(
    node: Node, cid: CID | str, what: str, decode: Callable[[bytes, CID], T]
) -> tuple[CID, T]:
    """Fetch a record (``what``, in messages) and ``decode`` it: the record-* checks."""
    return await _fetch(node, cid, what, decode)


async def fetch_record(node: Node, cid: CID | str) -> tuple[CID, RoundRecord]:
    """Fetch a round/2-4 record; check its hash, schema and the coordinator's signature.

    Checks: ``record-cid``, ``record-fetch``, ``record-hash``, ``record-signature``,
    ``record-format``.
    """
    return await _fetch(node, cid, "round record", lambda data, c: decode_record(data, cid=c))


async def fetch_any_record(node: Node, cid: CID | str) -> tuple[CID, AnyRoundRecord]:
    """:func:`fetch_record` of a round/2-4, a round/5 (stepped) or a tree/1 record, by its
    ``type``."""
    return await _fetch(node, cid, "round record", _decode_any)


def _decode_any(data: bytes, cid: CID) -> AnyRoundRecord:
    try:
        node = cbor.decode(data)
    except DAGError:
        node = None  # decode_record says what is wrong with it
    if isinstance(node, dict) and node.get("type") == RECORD_TYPE_STEPPED:
        return decode_stepped_record(data, cid=cid)
    if isinstance(node, dict) and node.get("type") == TREE_RECORD_TYPE:
        return decode_tree_record(data, cid=cid)
    return decode_record(data, cid=cid)


async def fetch_step_record(node: Node, cid: CID | str, step: str) -> tuple[CID, StepRecord]:
    """Fetch the step record a round/5 record links for ``step``, checked as
    :func:`fetch_record` checks a round record (the same check names)."""
    return await _fetch(
        node, cid, f"step record of {step!r}", lambda data, c: decode_step_record(data, cid=c)
    )


def check_expected(
    rcid: CID, record: AnyRoundRecord, coordinator: str | None = None, job: str | None = None
) -> None:
    """Refuse a record that is not the expected coordinator's (or not the expected job's).

    The signature check only proves that the key the record names signed it; whoever
    holds any key can sign a record naming itself. An auditor who knows the job's
    coordinator pins it here. Checks: ``expected-coordinator``, ``expected-job``.
    """
    if coordinator is not None and record.coordinator != coordinator:
        raise AuditError(
            "expected-coordinator",
            f"round record {rcid} (round {record.round}) is signed by {record.coordinator}, "
            f"not by the expected coordinator {coordinator}",
        )
    if job is not None and record.job != job:
        raise AuditError(
            "expected-job",
            f"round record {rcid} (round {record.round}) is of job {record.job!r}, "
            f"not of the expected job {job!r}",
        )
