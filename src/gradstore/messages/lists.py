"""Peer lists too long for a message, moved into a linked DAG-CBOR block.

A status or result names sets of peers as bitmaps (one bit a peer) and a status gives a
reason per refused peer. When that makes the signed message longer than ``INLINE_BYTES``
the lists move into one DAG-CBOR block, and the message carries its CID in ``lists``
instead. The message's signature covers the CID, and the CID covers the block, so a
receiver that fetches the block (verified against its hash) reads what the coordinator
signed. The block repeats job, run, round and step so one block cannot stand in for another.

Block shape: ``{type: "gradstore/lists/1", job, run, round, received, verified, refused,
reasons}``
for a status, ``{type, job, run, round, peers}`` for a result; a step's status or result
adds ``step`` (a message without a step has a block without it, byte for byte as before).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final

from ..dag import cbor
from ..dag.cid import CID, DAG_CBOR, verify_block
from ..errors import DAGError, MessageError, Reason
from .keys import SigningKey
from .roster import Roster
from .schema import MAX_REASON_BYTES, Result, Status, check_reasons
from .signing import check_bitmaps, encode_message

LISTS_TYPE: Final = "gradstore/lists/1"

#: A signed message longer than this moves its lists into a block (pubsub allows 1 MiB,
#: receivers refuse more than 64 KiB; the rest of a message is a few hundred bytes).
INLINE_BYTES: Final = 16 * 1024

#: The largest lists block (Kubo's default block size limit for `block/put` and bitswap).
MAX_LISTS_BYTES: Final = 1024 * 1024

_STATUS_KEYS: Final = frozenset(
    {"type", "job", "run", "round", "received", "verified", "refused", "reasons"}
)
_RESULT_KEYS: Final = frozenset({"type", "job", "run", "round", "peers"})


@dataclass(frozen=True)
class PeerLists:
    """The lists of a status (received, verified, refused, reasons) or of a result (peers)."""

    received: bytes = b""
    verified: bytes = b""
    refused: bytes = b""
    reasons: tuple[str, ...] = ()
    peers: bytes = b""


def inline_lists(msg: Status | Result) -> PeerLists:
    """The lists a message carries itself (empty when it links them)."""
    if isinstance(msg, Status):
        return PeerLists(msg.received, msg.verified, msg.refused, msg.reasons)
    return PeerLists(peers=msg.peers)


def encode_fitted(msg: Status | Result, key: SigningKey) -> tuple[bytes, tuple[CID, bytes] | None]:
    """The signed message, and the lists block when they had to move out of it.

    Store the block on the node before publishing the message that links it. Reasons
    that would make the block too large are shortened to their first word (the reason
    code), then dropped to ``"refused"``, so the block always fits.
    """
    data = encode_message(msg, key)
    if len(data) <= INLINE_BYTES:
        return data, None
    block = _lists_block(msg)
    if isinstance(msg, Status):
        linked: Status | Result = dataclasses.replace(
            msg, received=b"", verified=b"", refused=b"", reasons=(), lists=str(block[0])
        )
    else:
        linked = dataclasses.replace(msg, peers=b"", lists=str(block[0]))
    return encode_message(linked, key), block


def _lists_block(msg: Status | Result) -> tuple[CID, bytes]:
    node: dict[str, Any] = {"type": LISTS_TYPE, "job": msg.job, "run": msg.run, "round": msg.round}
    if msg.step is not None:
        node["step"] = msg.step
    if isinstance(msg, Result):
        node["peers"] = msg.peers
        data = cbor.encode(node)
    else:
        node["received"], node["verified"] = msg.received, msg.verified
        node["refused"] = msg.refused
        for reasons in (
            list(msg.reasons),
            [_code(r) for r in msg.reasons],
            ["refused"] * len(msg.reasons),
        ):
            node["reasons"] = reasons
            data = cbor.encode(node)
            if len(data) <= MAX_LISTS_BYTES:
                break
    if len(data) > MAX_LISTS_BYTES:
        raise MessageError(
            Reason.TOO_LARGE, f"the peer lists take {len(data)} bytes even shortened"
        )
    return CID.hash(DAG_CBOR, data), data


def _code(reason: str) -> str:
    """The reason code a reason starts with (``"too-large: ..."`` -> ``"too-large"``)."""
    return Reason.of(reason).value


def decode_lists(data: bytes, msg: Status | Result, roster: Roster) -> PeerLists:
    """The lists that ``msg`` links, from the block's bytes: hash, shape, and bitmaps checked."""
    if msg.lists is None:
        raise MessageError(Reason.MALFORMED, f"this {msg.kind.value} links no lists block")
    verify_block(CID.parse(msg.lists), data)
    if len(data) > MAX_LISTS_BYTES:
        raise MessageError(Reason.TOO_LARGE, f"lists block is {len(data)} bytes")
    try:
        node = cbor.decode(data)
    except DAGError as exc:
        raise MessageError(Reason.MALFORMED, f"lists block is {exc}") from None
    keys = _STATUS_KEYS if isinstance(msg, Status) else _RESULT_KEYS
    if msg.step is not None:
        keys = keys | {"step"}
    if not isinstance(node, dict) or set(node) != keys or node["type"] != LISTS_TYPE:
        raise MessageError(
            Reason.MALFORMED,
            f"not a {LISTS_TYPE} block for a {msg.kind.value}"
            + ("" if msg.step is None else f" of step {msg.step!r}"),
        )
    bound = (node["job"], node["run"], node["round"], node.get("step"))
    if bound != (msg.job, msg.run, msg.round, msg.step):
        raise MessageError(
            Reason.MALFORMED, "the lists block belongs to another job, run, round or step"
        )
    if isinstance(msg, Result):
        lists = PeerLists(peers=roster.check("peers", node["peers"]))
        check_bitmaps(dataclasses.replace(msg, peers=lists.peers, lists=None), roster)
        return lists
    reasons = node["reasons"]
    if not isinstance(reasons, list):
        raise MessageError(Reason.MALFORMED, "`reasons` must be an array")
    lists = PeerLists(
        roster.check("received", node["received"]),
        roster.check("verified", node["verified"]),
        roster.check("refused", node["refused"]),
        check_reasons("reasons", reasons),
    )
    inline = dataclasses.replace(
        msg,
        received=lists.received,
        verified=lists.verified,
        refused=lists.refused,
        reasons=lists.reasons,
        lists=None,
    )
    check_bitmaps(inline, roster)
    return lists


def shorten(reason: str) -> str:
    """``reason`` cut to what a message carries (``MAX_REASON_BYTES`` of UTF-8)."""
    raw = reason.encode("utf-8")
    if len(raw) <= MAX_REASON_BYTES:
        return reason
    return raw[: MAX_REASON_BYTES - 3].decode("utf-8", "ignore") + "..."
