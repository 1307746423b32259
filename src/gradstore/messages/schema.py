"""The three signed messages (announce, status, result) as frozen dataclasses, valid once built.

Construction normalizes what has one obvious canonical form (CIDs to base32
CIDv1 strings, did lists sorted) and refuses the rest with
``MessageError(Reason.MALFORMED, ...)``. Field order is wire order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar, Final

from ..dag.cid import CID, DAG_CBOR, canonical_v1, codec_name
from ..errors import CIDError, MessageError, Reason
from .didkey import public_key_from_did

PROTOCOL_VERSION: Final = 2
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
        raise MessageError(
            Reason.MALFORMED, f"`{name}` must be a non-empty string, got {value!r:.60}"
        )
    return value


def check_uint(name: str, value: object) -> int:
    if type(value) is not int or not 0 <= value <= MAX_UINT64:
        raise MessageError(
            Reason.MALFORMED, f"`{name}` must be an unsigned 64-bit int, got {value!r:.60}"
        )
    return value


def check_did(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise MessageError(
            Reason.MALFORMED, f"`{name}` must be a did:key string, got {type(value).__name__}"
        )
    try:
        public_key_from_did(value)
    except MessageError as exc:
        raise MessageError(Reason.MALFORMED, f"`{name}`: {exc}") from None
    return value


def check_cid(name: str, value: object, codec: int | None = None) -> str:
    """The canonical string (base32 CIDv1) of a CID given as a string or a ``CID``.

    A CIDv0 becomes its CIDv1: a signature then covers the one text a record's reader
    rebuilds, whichever form the sender started from.
    """
    if not isinstance(value, str | CID):
        raise MessageError(
            Reason.MALFORMED, f"`{name}` must be a CID string, got {type(value).__name__}"
        )
    canonical = canonical_v1(value) if isinstance(value, str) else None
    try:
        cid = canonical or CID.parse(value)
    except CIDError as exc:
        raise MessageError(Reason.MALFORMED, f"`{name}`: {exc}") from None
    if codec is not None and cid.codec != codec:
        raise MessageError(
            Reason.MALFORMED,
            f"`{name}` must be a {codec_name(codec)} CID, got {cid.codec_name}",
        )
    return value if canonical is not None and isinstance(value, str) else str(cid.to_v1())


def check_dids(name: str, value: object) -> tuple[str, ...]:
    """A sorted tuple of distinct dids (input order does not matter)."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a list of did:key strings")
    items = [check_did(f"{name}[{i}]", d) for i, d in enumerate(value)]
    out = tuple(sorted(items))
    if len(set(out)) != len(out):
        raise MessageError(Reason.MALFORMED, f"`{name}` lists a did twice")
    return out


_RUN_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")

#: A job name: it is part of pubsub topics and reaches file names and terminals.
JOB_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_job(name: str, value: object) -> str:
    """A job name: 1-64 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit."""
    if not isinstance(value, str) or not JOB_NAME.fullmatch(value):
        raise MessageError(
            Reason.MALFORMED,
            f"`{name}` must be 1-64 of A-Z a-z 0-9 . _ - (starting with a letter or digit), "
            f"got {value!r:.70}",
        )
    return value


def check_step(name: str, value: object) -> str:
    """A step name: the job name's rule (it reaches topics' readers, file names and terminals)."""
    return check_job(name, value)


def check_run(name: str, value: object) -> str:
    """A run id: 8-64 characters of ``a-z 0-9`` (the coordinator draws 26 base32 characters)."""
    if not isinstance(value, str) or not 8 <= len(value) <= 64 or not _RUN_CHARS.issuperset(value):
        raise MessageError(
            Reason.MALFORMED, f"`{name}` must be 8-64 characters of a-z 0-9, got {value!r:.70}"
        )
    return value


def check_bitmap(name: str, value: object) -> bytes:
    """A peer bitmap (its length is checked against the job's roster by ``verify_message``)."""
    if not isinstance(value, bytes):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a bitmap (bytes)")
    return value


def check_reasons(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a list of strings")
    out = tuple(value)
    for i, reason in enumerate(out):
        check_text(f"{name}[{i}]", reason)
        if len(reason.encode("utf-8")) > MAX_REASON_BYTES:
            raise MessageError(
                Reason.MALFORMED, f"`{name}[{i}]` is longer than {MAX_REASON_BYTES} bytes"
            )
    return out


#: A refusal reason on the wire is at most this long (the coordinator shortens longer ones).
MAX_REASON_BYTES: Final = 300


@dataclass(frozen=True, slots=True)
class Announce:
    """A peer's "my gradient for round ``round`` of run ``run`` is ``cid``", signed by ``peer``.

    ``run`` is the coordinator's run id, learnt from its signed status: an announcement
    replayed from another run of the same job is refused. ``step`` names the step of a
    stepped job the gradient is for (None, and off the wire, in a job without steps).
    """

    job: str
    run: str
    round: int
    step: str | None = field(default=None, kw_only=True)
    peer: str
    cid: str
    num_samples: int
    sent_at: int  # unix ms

    kind: ClassVar[MessageKind] = MessageKind.ANNOUNCE

    def __post_init__(self) -> None:
        check_job("job", self.job)
        check_run("run", self.run)
        check_uint("round", self.round)
        if self.step is not None:
            check_step("step", self.step)
        check_did("peer", self.peer)
        _set(self, "cid", check_cid("cid", self.cid))
        check_uint("num_samples", self.num_samples)
        check_uint("sent_at", self.sent_at)


@dataclass(frozen=True, slots=True)
class Result:
    """The coordinator's "round ``round`` aggregated ``peers`` into ``cid``, see ``record``".

    ``peers`` is a bitmap over the job's roster. When it would make the message too long it
    is empty and ``lists`` links a DAG-CBOR block that holds it (``messages.lists``).
    With ``step``, it is one step's result: ``cid`` the step's aggregate, ``record`` its
    step record.
    """

    job: str
    run: str
    round: int
    step: str | None = field(default=None, kw_only=True)
    cid: str
    record: str
    method: str
    peers: bytes
    sent_at: int
    lists: str | None = None

    kind: ClassVar[MessageKind] = MessageKind.RESULT

    def __post_init__(self) -> None:
        check_job("job", self.job)
        check_run("run", self.run)
        check_uint("round", self.round)
        if self.step is not None:
            check_step("step", self.step)
        _set(self, "cid", check_cid("cid", self.cid))
        _set(self, "record", check_cid("record", self.record, DAG_CBOR))
        check_text("method", self.method)
        check_bitmap("peers", self.peers)
        check_uint("sent_at", self.sent_at)
        if self.lists is not None:
            _set(self, "lists", check_cid("lists", self.lists, DAG_CBOR))
            if self.peers:
                raise MessageError(
                    Reason.MALFORMED, "a result with `lists` carries no `peers` bitmap"
                )


@dataclass(frozen=True, slots=True)
class Status:
    """The coordinator's "in round ``round`` I hold ``received``, verified ``verified``,
    refused ``refused``".

    ``received``, ``verified`` and ``refused`` are bitmaps over the job's roster;
    ``reasons`` gives one reason per refused peer, in roster order. ``failed`` says the round ended without an
    aggregate, and why. When the lists would make the message too long they are empty and
    ``lists`` links a DAG-CBOR block that holds them. With ``step``, it is one step's status.
    ``deadline`` (unix ms, the clock of ``sent_at``) is when the open round's (step's)
    deadline falls, once its clock started: what a waiting peer shows (None: off the wire).
    """

    job: str
    run: str
    round: int
    step: str | None = field(default=None, kw_only=True)
    received: bytes
    verified: bytes
    refused: bytes
    reasons: tuple[str, ...]
    sent_at: int
    deadline: int | None = field(default=None, kw_only=True)
    failed: str | None = None
    lists: str | None = None

    kind: ClassVar[MessageKind] = MessageKind.STATUS

    def __post_init__(self) -> None:
        check_job("job", self.job)
        check_run("run", self.run)
        check_uint("round", self.round)
        if self.step is not None:
            check_step("step", self.step)
        check_bitmap("received", self.received)
        check_bitmap("verified", self.verified)
        check_bitmap("refused", self.refused)
        _set(self, "reasons", check_reasons("reasons", self.reasons))
        check_uint("sent_at", self.sent_at)
        if self.deadline is not None:
            check_uint("deadline", self.deadline)
        if self.failed is not None:
            check_text("failed", self.failed)
        if self.lists is not None:
            _set(self, "lists", check_cid("lists", self.lists, DAG_CBOR))
            if self.received or self.verified or self.refused or self.reasons:
                raise MessageError(
                    Reason.MALFORMED, "a status with `lists` carries no inline lists"
                )


Message = Announce | Result | Status
MESSAGE_TYPES: Final[dict[str, type[Announce] | type[Result] | type[Status]]] = {
    cls.kind.value: cls for cls in (Announce, Result, Status)
}


def field_names(cls: type[Announce] | type[Result] | type[Status]) -> tuple[str, ...]:
    """The message's own fields, in wire order (between ``type`` and ``sig``)."""
    return tuple(f.name for f in fields(cls))


#: Fields that are left off the wire when None.
OPTIONAL_FIELDS: Final = frozenset({"step", "deadline", "failed", "lists"})


def unsigned_pairs(msg: Message) -> list[tuple[str, Any]]:
    """The (key, value) pairs that are signed: ``v``, ``type``, then the fields in order."""
    pairs: list[tuple[str, Any]] = [("v", PROTOCOL_VERSION), ("type", msg.kind.value)]
    for name in field_names(type(msg)):
        value = getattr(msg, name)
        if value is not None or name not in OPTIONAL_FIELDS:
            pairs.append((name, value))
    return pairs
