"""Read one Flower train reply: who sent what, or why it cannot enter the round (no I/O).

A reply is one of:

- **signed, CID mode**: a gradstore announcement and no arrays; the document travels over
  IPFS and is fetched and verified later, block by block;
- **signed, arrays mode**: an announcement and the arrays; the strategy recomputes the
  document's CID from the arrays and it must be the announced one;
- **unsigned**: plain Flower arrays and a sample count in the metrics; the client is named
  by its custodial did (see ``_protocol.custodial_did``), when the strategy allows it.

Every refusal is a ``RefusedError`` with a code, as the coordinator's are (``bad-signature``,
``wrong-run``, ``unsigned``, ...), and the node it came from (``node_id``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Message

from ..dag import CID
from ..errors import CIDError, MessageError, Reason, RefusedError
from ..format import Limits
from ..messages import Announce, announcement_signature, verify_message
from ._arrays import ArraysRefused, arrays_to_tensors, record_nbytes
from ._protocol import CONFIG_KEY, Instruction


@dataclass
class Candidate:
    """A reply that passed every check that needs no node: its peer, sample count, data."""

    node_id: int
    peer: str
    num_samples: int
    signed: bool
    cid: CID | None  # announced (signed replies); None for unsigned arrays
    tensors: dict[str, np.ndarray[Any, Any]] | None  # None in CID mode
    flower_bytes: int  # bytes of arrays the reply carried through Flower
    announced: tuple[int, bytes] | None = None  # a signed reply's (sent_at, signature)


@dataclass(frozen=True)
class ReplyRules:
    """What a reply of this round must be."""

    instruction: Instruction
    limits: Limits
    weighted_by_key: str
    peers: Collection[str] | None  # allowed dids; None: any signed client
    allow_unsigned: bool
    custodial: Callable[[int], str]


def read_reply(msg: Message, rules: ReplyRules) -> Candidate:
    """The reply as a ``Candidate``, or ``RefusedError`` (naming the node, and the peer and
    CID when the reply proved them)."""
    node_id = int(msg.metadata.src_node_id)
    if msg.has_error():
        raise RefusedError(Reason.CLIENT_ERROR, f"{msg.error.reason!s:.200}", node_id=node_id)
    content = msg.content
    config = content.config_records.get(CONFIG_KEY)
    announce = None if config is None else config.get("announce")
    arrays = list(content.array_records.values())
    if len(arrays) > 1:
        raise RefusedError(
            Reason.MALFORMED, f"{len(arrays)} ArrayRecords, expected at most 1", node_id=node_id
        )
    if announce is None:
        return _unsigned(node_id, msg, rules, arrays[0] if arrays else None)
    ann, signature = _announcement(node_id, announce, rules)
    cid = CID.parse(ann.cid)
    count = _metric_count(msg, rules.weighted_by_key)
    if count is not None and count != ann.num_samples:
        raise RefusedError(
            Reason.MALFORMED,
            f"metrics say {rules.weighted_by_key}={count}, the announcement {ann.num_samples}",
            node_id=node_id,
            peer=ann.peer,
            cid=cid,
        )
    tensors = None
    nbytes = 0
    if arrays:
        nbytes = record_nbytes(arrays[0])
        try:
            tensors = arrays_to_tensors(arrays[0], rules.limits)
        except ArraysRefused as exc:
            raise exc.about(node_id=node_id, peer=ann.peer, cid=cid) from None
    return Candidate(
        node_id, ann.peer, ann.num_samples, True, cid, tensors, nbytes, (ann.sent_at, signature)
    )


def _announcement(node_id: int, data: object, rules: ReplyRules) -> tuple[Announce, bytes]:
    ins = rules.instruction
    if not isinstance(data, bytes):
        raise RefusedError(Reason.MALFORMED, "`announce` must be bytes", node_id=node_id)
    try:
        msg = verify_message(data, job=ins.job, coordinator=ins.coordinator, peers=rules.peers)
    except MessageError as exc:
        raise RefusedError(exc.code, exc.detail, node_id=node_id) from None  # bad-signature, ...
    if not isinstance(msg, Announce):
        raise RefusedError(
            Reason.MALFORMED, f"a {msg.kind} message is not a reply", node_id=node_id
        )
    try:
        cid = CID.parse(msg.cid)
    except CIDError as exc:  # verify_message checked it already; belt and braces
        raise RefusedError(Reason.MALFORMED, str(exc), node_id=node_id, peer=msg.peer) from None
    if msg.run != ins.run:
        raise RefusedError(
            Reason.WRONG_RUN,
            f"{msg.run}, this run is {ins.run}",
            node_id=node_id,
            peer=msg.peer,
            cid=cid,
        )
    if msg.round != ins.round:
        raise RefusedError(
            Reason.WRONG_ROUND,
            f"{msg.round}, this is {ins.round}",
            node_id=node_id,
            peer=msg.peer,
            cid=cid,
        )
    if msg.num_samples < 1:
        raise RefusedError(
            Reason.MALFORMED,
            "num_samples must be at least 1",
            node_id=node_id,
            peer=msg.peer,
            cid=cid,
        )
    return msg, announcement_signature(data)[1]


def _metric_count(msg: Message, key: str) -> int | None:
    for record in msg.content.metric_records.values():
        if key in record:
            value = record[key]
            if isinstance(value, float) and value.is_integer():
                return int(value)
            return value if type(value) is int else -1
    return None


def _unsigned(node_id: int, msg: Message, rules: ReplyRules, arrays: Any) -> Candidate:
    if not rules.allow_unsigned or rules.peers is not None:
        raise RefusedError(
            Reason.UNSIGNED,
            "the reply carries no signed gradstore announcement "
            "(use gradstore.flower.GradstoreClient in the ClientApp)",
            node_id=node_id,
        )
    peer = rules.custodial(node_id)
    if arrays is None:
        raise RefusedError(
            Reason.MALFORMED,
            "the reply has neither arrays nor an announcement",
            node_id=node_id,
            peer=peer,
        )
    count = _metric_count(msg, rules.weighted_by_key)
    if count is None or count < 1:
        raise RefusedError(
            Reason.MALFORMED,
            f"the metrics need a positive integer {rules.weighted_by_key!r}",
            node_id=node_id,
            peer=peer,
        )
    try:
        tensors = arrays_to_tensors(arrays, rules.limits)
    except ArraysRefused as exc:
        raise exc.about(node_id=node_id, peer=peer) from None
    return Candidate(node_id, peer, count, False, None, tensors, record_nbytes(arrays))
