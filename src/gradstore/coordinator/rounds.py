"""One round's book (of one step) and its rules (when it closes, who is aggregated): pure, no I/O.

Each expected peer moves pending -> received(cid) -> verified -> aggregated, or to
failed(reason). The clock of a round starts at its first accepted announcement (not
when the coordinator opened it), so a round nobody has started yet cannot time out while
the peers are still getting ready. A round closes when every expected peer is settled,
or at its deadline; it is aggregated if the quorum is verified, and fails otherwise.

A stepped job (``[[steps]]``) keeps one book per (round, step), each with the step's own
peers, and applies these rules to each book with the step's deadline and quorum; the steps
of a round share its clock (``share_clock``). A job without steps has one book per round,
whose ``step`` is None (its messages name no step).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..errors import Reason, reason_text
from ..format import ITEMSIZE, CompressedGradient, CompressedTensor, Gradient, dtype_code
from .binding import duplicates

Schema = tuple[tuple[str, str, tuple[int, ...]], ...]


def schema_bytes(schema: Schema | None) -> int:
    """The dense bytes of a document of ``schema`` (0: no schema known yet)."""
    total = 0
    for _, dtype, shape in schema or ():
        count = 1
        for n in shape:
            count *= n
        total += count * ITEMSIZE.get(dtype, 0)
    return total


class PeerState(StrEnum):
    PENDING = "pending"
    RECEIVED = "received"
    VERIFIED = "verified"
    AGGREGATED = "aggregated"
    FAILED = "failed"


ABSENT = reason_text(Reason.ABSENT, "never announced")


@dataclass
class Slot:
    """What the coordinator knows of one expected peer in one round."""

    peer: str
    state: PeerState = PeerState.PENDING
    cid: str | None = None
    num_samples: int = 0
    reason: str | None = None
    nbytes: int = 0
    schema: Schema | None = None
    accepted_at: float = 0.0  # when its announcement was accepted: the first of a CID keeps it

    @property
    def settled(self) -> bool:
        """Nothing more will happen to this peer in this round."""
        return self.state in (PeerState.VERIFIED, PeerState.FAILED, PeerState.AGGREGATED)


@dataclass
class RoundBook:
    """The state of one round (of one step): a slot per expected peer and the refusals to
    tell peers. ``step`` is the step's name (None: the one step of a job without steps)."""

    round: int
    peers: tuple[str, ...]
    opened_at: float
    started_at: float | None = None  # first accepted announcement (of any step of the round)
    grace_until: float = 0.0  # after a restart: inputs are re-resolved until then
    slots: dict[str, Slot] = field(default_factory=dict)
    refusals: dict[str, str] = field(default_factory=dict)  # peer -> reason, told in statuses
    step: str | None = None

    def __post_init__(self) -> None:
        if not self.slots:
            self.slots = {p: Slot(p) for p in self.peers}

    def accept(self, peer: str, cid: str, num_samples: int, at: float) -> Slot:
        """Record ``peer``'s accepted announcement (made durable by the caller first)."""
        slot = self.slots[peer]
        slot.state, slot.cid, slot.num_samples = PeerState.RECEIVED, cid, num_samples
        slot.accepted_at = at
        self.refusals.pop(peer, None)
        if self.started_at is None or at < self.started_at:
            self.started_at = max(at, self.opened_at)
        return slot

    def fail(self, peer: str, reason: str) -> None:
        slot = self.slots[peer]
        slot.state, slot.reason = PeerState.FAILED, reason
        self.refusals[peer] = reason

    def verify(self, peer: str, nbytes: int, schema: Schema) -> None:
        slot = self.slots[peer]
        slot.state, slot.nbytes, slot.schema = PeerState.VERIFIED, nbytes, schema

    def refuse(self, peer: str, reason: str) -> bool:
        """Remember a refused announcement to tell ``peer``; True if that is news."""
        if self.refusals.get(peer) == reason:
            return False
        self.refusals[peer] = reason
        return True

    def in_state(self, *states: PeerState) -> list[str]:
        return sorted(p for p, s in self.slots.items() if s.state in states)

    @property
    def settled(self) -> bool:
        return all(s.settled for s in self.slots.values())

    def deadline(self, deadline_s: float) -> float | None:
        """When the round's deadline falls (None: its clock has not started)."""
        return None if self.started_at is None else self.started_at + deadline_s

    def counts(self) -> dict[str, int]:
        states = [s.state for s in self.slots.values()]
        return {
            "expected": len(states),
            "received": sum(s != PeerState.PENDING for s in states),
            "verified": sum(s in (PeerState.VERIFIED, PeerState.AGGREGATED) for s in states),
            "failed": states.count(PeerState.FAILED),
        }


def share_clock(books: Iterable[RoundBook]) -> None:
    """The steps of one round share its clock: it starts at the first announcement accepted
    in any of them, so a step nobody announced to still closes at its own deadline."""
    books = list(books)
    started = [b.started_at for b in books if b.started_at is not None]
    if started:
        for book in books:
            book.started_at = min(started)


@dataclass(frozen=True)
class CloseCheck:
    """Whether to close now; if not, when to look again (None: only on news)."""

    close: bool
    why: str = ""
    wake_at: float | None = None


def should_close(book: RoundBook, deadline_s: float, now: float) -> CloseCheck:
    """Close when every expected peer is settled, or at the deadline.

    After a restart past the deadline (``grace_until`` set), the inputs journaled before
    the crash are being resolved again: the round then closes once none is in flight, or
    when the grace period ends, whichever comes first.
    """
    if book.settled:
        return CloseCheck(True, "every peer settled")
    deadline = book.deadline(deadline_s)
    if deadline is None:
        return CloseCheck(False)
    if now < deadline:
        return CloseCheck(False, wake_at=deadline)
    if now < book.grace_until and book.in_state(PeerState.RECEIVED):
        return CloseCheck(False, wake_at=book.grace_until)
    return CloseCheck(True, "deadline")


@dataclass(frozen=True)
class Judgement:
    """Who a closing round aggregates and who it excludes (with why), or why it fails."""

    verified: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...]
    failure: str | None


def cut_off(book: RoundBook) -> list[str]:
    """At close, inputs still in flight fail: they were not verified by the deadline."""
    late = book.in_state(PeerState.RECEIVED)
    for peer in late:
        book.fail(peer, reason_text(Reason.UNAVAILABLE, "not verified by the deadline"))
    return late


def drop_duplicate_cids(book: RoundBook) -> list[str]:
    """Verified inputs that repeat a CID an earlier announcement of the round holds fail.

    Earlier by acceptance time, ties by peer id, so every coordinator decides the same.
    Returns the peers that failed (``duplicate-cid``).
    """
    order = sorted(book.in_state(PeerState.VERIFIED), key=lambda p: (book.slots[p].accepted_at, p))
    repeated = duplicates((p, book.slots[p].cid or "") for p in order)
    for peer, reason in repeated.items():
        book.fail(peer, reason)
    return sorted(repeated)


def keep_majority_schema(book: RoundBook) -> list[str]:
    """Without a configured or learned schema, inputs that disagree with the majority fail.

    Ties go to the schema of the lowest peer id, so every coordinator decides the same.
    Returns the peers that failed.
    """
    groups: dict[Schema, list[str]] = {}
    for peer in book.in_state(PeerState.VERIFIED):
        schema = book.slots[peer].schema
        assert schema is not None
        groups.setdefault(schema, []).append(peer)
    if len(groups) <= 1:
        return []
    keep = max(groups.items(), key=lambda kv: (len(kv[1]), [-ord(c) for c in kv[1][0]]))[0]
    dropped = []
    for schema, peers in groups.items():
        if schema != keep:
            for peer in peers:
                book.fail(
                    peer,
                    reason_text(
                        Reason.SCHEMA_MISMATCH, f"disagrees with the majority ({schema_text(keep)})"
                    ),
                )
                dropped.append(peer)
    return dropped


def judge(book: RoundBook, quorum: int) -> Judgement:
    """The verified inputs in canonical order (sorted by peer id), the exclusions, the verdict."""
    verified = tuple(book.in_state(PeerState.VERIFIED))
    excluded = tuple(
        (p, s.reason or ABSENT)
        for p, s in sorted(book.slots.items())
        if s.state not in (PeerState.VERIFIED, PeerState.AGGREGATED)
    )
    failure = None
    if len(verified) < quorum:
        failure = f"quorum not met: {len(verified)} verified of {quorum} needed"
    return Judgement(verified, excluded, failure)


def schema_of(gradient: Gradient | CompressedGradient) -> Schema:
    """(name, dtype, shape) of every tensor, sorted by name: what every input of a job must share.

    Dtypes are the document's type strings (``"<f4"``, ``"bfloat16"``), as the job file's
    ``[[schema]]`` names them; NumPy's own string for bfloat16 would be ``"<V2"``. A
    compressed tensor counts as the dense tensor it stands for.
    """
    tensors: dict[str, Any] = dict(gradient.tensors)
    return tuple(
        (name, _dtype_text(arr), tuple(arr.shape))
        for name, arr in sorted(tensors.items(), key=lambda kv: kv[0].encode())
    )


def _dtype_text(arr: Any) -> str:
    if isinstance(arr, CompressedTensor):
        return arr.dtype_code
    return dtype_code(arr.dtype) or str(arr.dtype)


def schema_text(schema: Schema) -> str:
    return ", ".join(f"{n}:{d}{list(s)}" for n, d, s in schema)


def schema_from_json(value: Iterable[Any]) -> Schema:
    return tuple((str(n), str(d), tuple(int(x) for x in s)) for n, d, s in value)
