"""The three signed messages of DESIGN 5 as frozen dataclasses that are valid once built.

Construction normalizes what has one obvious canonical form (CIDs to base32
CIDv1 strings, did lists sorted) and refuses the rest with
``MessageError("malformed", ...)``. Field order is wire order.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar, Final

from ..dag.cid import CID, DAG_CBOR, codec_name
from ..errors import CIDError, MessageError
from .didkey import public_key_from_did

PROTOCOL_VERSION: Final = 1
MAX_UINT64: Final = 2**64 - 1


class MessageKind(StrEnum):
    """The ``type`` field of a message."""

    ANNOUNCE = "announce"
    RESULT = "result"
    STATUS = "status"


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def check_text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise MessageError("malformed", f"`{name}` must be a non-empty string, got {value!r:.60}")
    return value


def check_uint(name: str, value: object) -> int:
    if type(value) is not int or not 0 <= value <= MAX_UINT64:
        raise MessageError(
            "malformed", f"`{name}` must be an unsigned 64-bit int, got {value!r:.60}"
        )
    return value


def check_did(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise MessageError(
            "malformed", f"`{name}` must be a did:key string, got {type(value).__name__}"
        )
    try:
        public_key_from_did(value)
    except MessageError as exc:
        raise MessageError("malformed", f"`{name}`: {exc}") from None
    return value


def _fast_parse(text: str) -> CID:
    """``CID.parse``, with a stdlib fast path for base32 CIDv1 (multiformats costs ~0.5 ms)."""
    if text.startswith("b") and text.isascii() and text[1:].isalnum() and text[1:].islower():
        body = text[1:].upper()
        try:
            return CID.from_bytes(base64.b32decode(body + "=" * (-len(body) % 8)))
        except (binascii.Error, ValueError):
            pass  # let CID.parse explain what is wrong
    return CID.parse(text)


def check_cid(name: str, value: object, codec: int | None = None) -> str:
    """The canonical string of a CID given as a string or a ``CID``."""
    if not isinstance(value, str | CID):
        raise MessageError(
            "malformed", f"`{name}` must be a CID string, got {type(value).__name__}"
        )
    try:
        cid = _fast_parse(value) if isinstance(value, str) else value
    except CIDError as exc:
        raise MessageError("malformed", f"`{name}`: {exc}") from None
    if codec is not None and cid.codec != codec:
        raise MessageError(
            "malformed",
            f"`{name}` must be a {codec_name(codec)} CID, got {cid.codec_name}",
        )
    return str(cid)


def check_dids(name: str, value: object) -> tuple[str, ...]:
    """A sorted tuple of distinct dids (input order does not matter)."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise MessageError("malformed", f"`{name}` must be a list of did:key strings")
    items = [check_did(f"{name}[{i}]", d) for i, d in enumerate(value)]
    out = tuple(sorted(items))
    if len(set(out)) != len(out):
        raise MessageError("malformed", f"`{name}` lists a did twice")
    return out


@dataclass(frozen=True, slots=True)
class Announce:
    """A peer's "my gradient for this round is ``cid``", signed by ``peer``."""

    job: str
    round: int
    peer: str
    cid: str
    num_samples: int
    sent_at: int  # unix ms

    kind: ClassVar[MessageKind] = MessageKind.ANNOUNCE

    def __post_init__(self) -> None:
        check_text("job", self.job)
        check_uint("round", self.round)
        check_did("peer", self.peer)
        _set(self, "cid", check_cid("cid", self.cid))
        check_uint("num_samples", self.num_samples)
        check_uint("sent_at", self.sent_at)


@dataclass(frozen=True, slots=True)
class Result:
    """The coordinator's "this round aggregated ``peers`` into ``cid``, see ``record``"."""

    job: str
    round: int
    cid: str
    record: str
    method: str
    peers: tuple[str, ...]
    sent_at: int

    kind: ClassVar[MessageKind] = MessageKind.RESULT

    def __post_init__(self) -> None:
        check_text("job", self.job)
        check_uint("round", self.round)
        _set(self, "cid", check_cid("cid", self.cid))
        _set(self, "record", check_cid("record", self.record, DAG_CBOR))
        check_text("method", self.method)
        _set(self, "peers", check_dids("peers", self.peers))
        check_uint("sent_at", self.sent_at)


@dataclass(frozen=True, slots=True)
class Status:
    """The coordinator's "for round ``round`` I hold announcements from ``received``".

    ``failed`` (gradstore's addition to DESIGN 5, on the wire only when set) says
    the round ended without an aggregate, and why (e.g. ``"quorum not met: ..."``).
    """

    job: str
    round: int
    received: tuple[str, ...]
    sent_at: int
    failed: str | None = None

    kind: ClassVar[MessageKind] = MessageKind.STATUS

    def __post_init__(self) -> None:
        check_text("job", self.job)
        check_uint("round", self.round)
        _set(self, "received", check_dids("received", self.received))
        check_uint("sent_at", self.sent_at)
        if self.failed is not None:
            check_text("failed", self.failed)


Message = Announce | Result | Status
MESSAGE_TYPES: Final[dict[str, type[Announce] | type[Result] | type[Status]]] = {
    cls.kind.value: cls for cls in (Announce, Result, Status)
}


def field_names(cls: type[Announce] | type[Result] | type[Status]) -> tuple[str, ...]:
    """The message's own fields, in wire order (between ``type`` and ``sig``)."""
    return tuple(f.name for f in fields(cls))


#: Fields that are left off the wire when None (so messages without them stay as DESIGN 5 has them).
OPTIONAL_FIELDS: Final = frozenset({"failed"})


def unsigned_pairs(msg: Message) -> list[tuple[str, Any]]:
    """The (key, value) pairs that are signed: ``v``, ``type``, then the fields in order."""
    pairs: list[tuple[str, Any]] = [("v", PROTOCOL_VERSION), ("type", msg.kind.value)]
    for name in field_names(type(msg)):
        value = getattr(msg, name)
        if value is not None or name not in OPTIONAL_FIELDS:
            pairs.append((name, value))
    return pairs
