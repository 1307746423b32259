"""Signed messages on the wire: encode + sign, strict decode, and verification in a job's context.

A message is a canonical msgpack map ``v, type, <fields>, sig`` where ``sig``
is the Ed25519 signature over the encoding of the same map without ``sig``.
Announcements name their signer (``peer``); results and statuses are signed
by the job's coordinator, which the receiver must supply.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

from ..errors import MessageError, Reason
from .didkey import SIGNATURE_LEN, public_key_from_did, verify_signature
from .keys import SigningKey
from .roster import Roster
from .schema import (
    MESSAGE_TYPES,
    OPTIONAL_FIELDS,
    PROTOCOL_VERSION,
    Announce,
    Message,
    Result,
    Status,
    field_names,
    unsigned_pairs,
)
from .wire import pack_map, unpack_map

# Pubsub allows messages up to 1 MiB; ours are a few hundred bytes. Peer sets are bitmaps
# and long lists move to a linked block (``lists``), so no message needs more than this.
MAX_MESSAGE_BYTES: Final = 64 * 1024


def encode_message(msg: Message, key: SigningKey) -> bytes:
    """The signed wire bytes of ``msg``; an announcement must be signed by its ``peer``."""
    if isinstance(msg, Announce) and key.did != msg.peer:
        raise MessageError(
            Reason.BAD_SIGNATURE, f"an announcement for {msg.peer} cannot be signed by {key.did}"
        )
    pairs = unsigned_pairs(msg)
    return pack_map([*pairs, ("sig", key.sign(pack_map(pairs)))])


def _decode_unverified(data: bytes, max_bytes: int) -> tuple[Message, bytes, bytes]:
    """The message, the bytes its signature covers, and the signature; no signature check."""
    if len(data) > max_bytes:
        raise MessageError(
            Reason.TOO_LARGE, f"message is {len(data)} bytes, the limit is {max_bytes}"
        )
    pairs = unpack_map(data)
    keys = [k for k, _ in pairs]
    if keys[:2] != ["v", "type"]:
        raise MessageError(Reason.MALFORMED, f"a message starts with `v`, `type`; got {keys[:2]}")
    version, kind = pairs[0][1], pairs[1][1]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise MessageError(
            Reason.MALFORMED,
            f"unsupported message version {version!r:.20} (this is v={PROTOCOL_VERSION})",
        )
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        raise MessageError(Reason.UNKNOWN_TYPE, f"unknown message type {kind!r:.40}")
    cls = MESSAGE_TYPES[kind]
    names = [n for n in field_names(cls) if n not in OPTIONAL_FIELDS or n in keys]
    expected = ["v", "type", *names, "sig"]
    if keys != expected:
        raise MessageError(Reason.MALFORMED, f"`{kind}` messages have keys {expected}, got {keys}")
    values: dict[str, Any] = dict(pairs)
    if "reasons" in values:
        if not isinstance(values["reasons"], list):
            raise MessageError(Reason.MALFORMED, "`reasons` must be an array")
        values["reasons"] = tuple(values["reasons"])
    signature = values["sig"]
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_LEN:
        raise MessageError(Reason.MALFORMED, f"`sig` must be {SIGNATURE_LEN} bytes (msgpack bin)")
    for name in OPTIONAL_FIELDS.intersection(values):
        if values[name] is None:  # an unset optional field is left off the wire, never nil
            raise MessageError(Reason.MALFORMED, f"`{name}` is nil; leave it out instead")
    msg = cls(**{name: values[name] for name in names})
    for name in _NORMALISED:  # construction normalises CID strings: a non-canonical one differs
        if name in values and getattr(msg, name) != values[name]:
            raise MessageError(
                Reason.MALFORMED, f"`{name}` is not in canonical form (base32 CIDv1)"
            )
    # The map without `sig`: the same bytes with the map header one entry shorter (the
    # encoding is canonical, checked above) and the trailing `sig` entry cut off.
    count = len(pairs) - 1
    unsigned = _map_header(count) + bytes(data[len(_map_header(len(pairs))) : -_SIG_ENTRY])
    return msg, unsigned, signature


#: Fields whose value a message's construction may rewrite into canonical form.
_NORMALISED: Final = ("cid", "record", "lists")

#: The encoded `sig` entry: fixstr "sig", bin8 header, 64 signature bytes.
_SIG_ENTRY: Final = 1 + 3 + 2 + SIGNATURE_LEN


def _map_header(count: int) -> bytes:
    return bytes([0x80 | count]) if count < 16 else b"\xde" + count.to_bytes(2, "big")


def announcement_signature(data: bytes) -> tuple[Announce, bytes]:
    """A signed announcement's message and its peer's signature (checked), e.g. for a record.

    A round/4 record carries the signature so an auditor can check each input's sample
    count against the peer's own word, not the coordinator's.
    """
    msg, unsigned, signature = _decode_unverified(data, MAX_MESSAGE_BYTES)
    if not isinstance(msg, Announce):
        raise MessageError(Reason.UNEXPECTED_TYPE, f"a {msg.kind.value} is not an announcement")
    if not verify_signature(msg.peer, unsigned, signature):
        raise MessageError(Reason.BAD_SIGNATURE, f"announcement signature is not {msg.peer}'s")
    return msg, signature


def announcement_signed(msg: Announce, signature: bytes) -> bool:
    """Whether ``signature`` is ``msg.peer``'s over ``msg`` (rebuilt from its fields)."""
    return verify_signature(msg.peer, pack_map(unsigned_pairs(msg)), signature)


def decode_message(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Strictly decode a message; an announcement's signature is checked against its ``peer``.

    Results and statuses come back **unauthenticated**: only the receiver knows
    the coordinator, so use ``verify_message`` for anything you act on.
    """
    msg, unsigned, signature = _decode_unverified(data, max_bytes)
    if isinstance(msg, Announce) and not verify_signature(msg.peer, unsigned, signature):
        raise MessageError(Reason.BAD_SIGNATURE, f"announcement signature is not {msg.peer}'s")
    return msg


def verify_message(
    data: bytes,
    *,
    job: str,
    coordinator: str,
    peers: Roster | Collection[str] | None = None,
    max_bytes: int = MAX_MESSAGE_BYTES,
    owners: Mapping[str, str] | None = None,
    results_by: str | None = None,
) -> Message:
    """Decode a message and accept it only if it belongs to ``job`` and is signed by the right key.

    ``owners`` (a job split among coordinators, docs/design/multicoord.md): the did that
    owns each step another coordinator than ``coordinator`` owns; a status or result of
    such a step must be signed by that owner, every other one by ``coordinator``.

    ``results_by`` (a group of a tree job, docs/design/multicoord.md): the did that signs
    the round's results (the tree's root); statuses stay ``coordinator``'s (the group's leaf).

    An announcement must be signed by its ``peer``, who must be in ``peers``
    when given; a result or status must be signed by ``coordinator`` (they name
    no signer, so any other signature, or an altered one, is "not-coordinator"),
    and its bitmaps must fit the roster of ``peers`` when given. Freshness
    (``sent_at``) and the run id are the receiver's to judge. Refusals are
    ``MessageError`` with ``code`` (a ``Reason``) one of too-large, malformed, unknown-type,
    wrong-job, unknown-peer, bad-signature, not-coordinator.
    """
    public_key_from_did(coordinator)  # a bad coordinator id is the caller's error, say so early
    msg, unsigned, signature = _decode_unverified(data, max_bytes)
    if msg.job != job:
        raise MessageError(Reason.WRONG_JOB, f"message is for job {msg.job!r}, not {job!r}")
    if isinstance(msg, Announce):
        if peers is not None and msg.peer not in peers:
            raise MessageError(Reason.UNKNOWN_PEER, f"{msg.peer} is not a peer of job {job!r}")
        if not verify_signature(msg.peer, unsigned, signature):
            raise MessageError(Reason.BAD_SIGNATURE, f"announcement signature is not {msg.peer}'s")
    else:
        signer = coordinator
        if owners and msg.step is not None:
            signer = owners.get(msg.step, coordinator)
        elif results_by is not None and isinstance(msg, Result) and msg.step is None:
            signer = results_by
        if not verify_signature(signer, unsigned, signature):
            raise MessageError(
                Reason.NOT_COORDINATOR,
                f"{msg.kind.value} is not signed by coordinator {signer} (or was altered)",
            )
        if peers is not None:
            check_bitmaps(msg, peers if isinstance(peers, Roster) else Roster(peers))
    return msg


def check_bitmaps(msg: Status | Result, roster: Roster) -> None:
    """MessageError unless the message's inline bitmaps fit ``roster`` (or it has ``lists``)."""
    if msg.lists is not None:
        return
    if isinstance(msg, Status):
        roster.check("received", msg.received)
        roster.check("verified", msg.verified)
        roster.check("refused", msg.refused)
        refused = sum(bin(b).count("1") for b in msg.refused)
        if len(msg.reasons) != refused:
            raise MessageError(
                Reason.MALFORMED,
                f"`reasons` has {len(msg.reasons)} entries for {refused} refused peers",
            )
    else:
        roster.check("peers", msg.peers)
