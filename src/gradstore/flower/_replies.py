"""Read one Flower train reply: who sent what, or why it cannot enter the round (no I/O).

A reply is one of:

- **signed, CID mode**: a gradstore announcement and no arrays; the document travels over
  IPFS and is fetched and verified later, block by block;
- **signed, arrays mode**: an announcement and the arrays; the strategy recomputes the
  document's CID from the arrays and it must be the announced one;
- **unsigned**: plain Flower arrays and a sample count in the metrics; the client is named
  by its custodial did (see ``_protocol.custodial_did``), when the strategy allows it.

Every refusal is a ``Refused`` with a reason that starts with a code, as the coordinator's
do (``bad-signature: ...``, ``wrong-run: ...``, ``unsigned: ...``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Message

from ..dag import CID
from ..errors import CIDError, MessageError
from ..format import Limits
from ..messages import Announce, announcement_signature, verify_message
from ._arrays import ArraysRefused, arrays_to_tensors, record_nbytes
from ._protocol import CONFIG_KEY, Instruction


class Refused(Exception):
    """A reply that cannot enter the round, with the peer it names (if any) and why."""

    def __init__(self, node_id: int, peer: str | None, reason: str, cid: CID | None = None) -> None:
        super().__init__(reason)
        self.node_id = node_id
        self.peer = peer
        self.reason = reason
        self.cid = cid


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
    """The reply as a ``Candidate``, or ``Refused``."""
    node_id = int(msg.metadata.src_node_id)
    if msg.has_error():
        raise Refused(node_id, None, f"client-error: {msg.error.reason!s:.200}")
    content = msg.content
    config = content.config_records.get(CONFIG_KEY)
    announce = None if config is None else config.get("announce")
    arrays = list(content.array_records.values())
    if len(arrays) > 1:
        raise Refused(node_id, None, f"malformed: {len(arrays)} ArrayRecords, expected at most 1")
    if announce is None:
        return _unsigned(node_id, msg, rules, arrays[0] if arrays else None)
    ann, signature = _announcement(node_id, announce, rules)
    cid = CID.parse(ann.cid)
    count = _metric_count(msg, rules.weighted_by_key)
    if count is not None and count != ann.num_samples:
        raise Refused(
            node_id,
            ann.peer,
            f"malformed: metrics say {rules.weighted_by_key}={count}, the announcement "
            f"{ann.num_samples}",
            cid,
        )
    tensors = None
    nbytes = 0
    if arrays:
        nbytes = record_nbytes(arrays[0])
        try:
            tensors = arrays_to_tensors(arrays[0], rules.limits)
        except ArraysRefused as exc:
            raise Refused(node_id, ann.peer, exc.reason, cid) from None
    return Candidate(
        node_id, ann.peer, ann.num_samples, True, cid, tensors, nbytes, (ann.sent_at, signature)
    )


def _announcement(node_id: int, data: object, rules: ReplyRules) -> tuple[Announce, bytes]:
    ins = rules.instruction
    if not isinstance(data, bytes):
        raise Refused(node_id, None, "malformed: `announce` must be bytes")
    try:
        msg = verify_message(data, job=ins.job, coordinator=ins.coordinator, peers=rules.peers)
    except MessageError as exc:
        raise Refused(node_id, None, str(exc)) from None  # "bad-signature: ...", ...
    if not isinstance(msg, Announce):
        raise Refused(node_id, None, f"malformed: a {msg.kind} message is not a reply")
    try:
        cid = CID.parse(msg.cid)
    except CIDError as exc:  # verify_message checked it already; belt and braces
        raise Refused(node_id, msg.peer, f"malformed: {exc}") from None
    if msg.run != ins.run:
        raise Refused(node_id, msg.peer, f"wrong-run: {msg.run}, this run is {ins.run}", cid)
    if msg.round != ins.round:
        raise Refused(node_id, msg.peer, f"wrong-round: {msg.round}, this is {ins.round}", cid)
    if msg.num_samples < 1:
        raise Refused(node_id, msg.peer, "malformed: num_samples must be at least 1", cid)
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
        raise Refused(
            node_id,
            None,
            "unsigned: the reply carries no signed gradstore announcement "
            "(use gradstore.flower.GradstoreClient in the ClientApp)",
        )
    peer = rules.custodial(node_id)
    if arrays is None:
        raise Refused(node_id, peer, "malformed: the reply has neither arrays nor an announcement")
    count = _metric_count(msg, rules.weighted_by_key)
    if count is None or count < 1:
        raise Refused(
            node_id,
            peer,
            f"malformed: the metrics need a positive integer {rules.weighted_by_key!r}",
        )
    try:
        tensors = arrays_to_tensors(arrays, rules.limits)
    except ArraysRefused as exc:
        raise Refused(node_id, peer, exc.reason) from None
    return Candidate(node_id, peer, count, False, None, tensors, record_nbytes(arrays))
