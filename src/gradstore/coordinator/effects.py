"""What the coordinator's state hands back to the service: journal rows, wakes, orders.

``Effects`` is what the service does after an event (``state.CoordinatorState``); each
journal row is a small ``Write`` that knows its journal call. A row of a job without
steps has ``step`` None and is written as before steps existed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..dag import CID
from ..format import Gradient
from ..job import StepConfig
from .binding import Claim
from .inputs import VerifiedInput
from .rounds import PeerState, Schema

if TYPE_CHECKING:
    from .journal import Journal


class Write(Protocol):
    """One journal row to queue (the journal writer, or the close, commits it)."""

    def to(self, journal: Journal) -> None: ...


@dataclass(frozen=True, slots=True)
class Accept:
    """An accepted announcement, with its signed bytes."""

    round: int
    peer: str
    cid: str
    num_samples: int
    message: bytes
    step: str | None = None

    def to(self, journal: Journal) -> None:
        journal.accept(
            self.round, self.peer, self.cid, self.num_samples, self.message, step=self.step
        )


@dataclass(frozen=True, slots=True)
class SetInput:
    """An input's new state (and why, when it failed)."""

    round: int
    peer: str
    state: PeerState
    reason: str | None = None
    step: str | None = None

    def to(self, journal: Journal) -> None:
        journal.set_input_state(self.round, self.peer, self.state, self.reason, step=self.step)


@dataclass(frozen=True, slots=True)
class CloseRound:
    """A closed round: its output and record (a stepped round's: model-level, round/5)."""

    round: int
    output: str
    record: str

    def to(self, journal: Journal) -> None:
        journal.close_round(self.round, self.output, self.record)


@dataclass(frozen=True, slots=True)
class FailRound:
    round: int
    reason: str

    def to(self, journal: Journal) -> None:
        journal.fail_round(self.round, self.reason)


@dataclass(frozen=True, slots=True)
class CloseStep:
    """A closed step of a stepped round: its aggregate and step record."""

    round: int
    step: str
    output: str
    record: str

    def to(self, journal: Journal) -> None:
        journal.close_step(self.round, self.step, self.output, self.record)


@dataclass(frozen=True, slots=True)
class FailStep:
    round: int
    step: str
    reason: str

    def to(self, journal: Journal) -> None:
        journal.fail_step(self.round, self.step, self.reason)


@dataclass(frozen=True, slots=True)
class LearnSchema:
    """The schema of the job's (or the step's) first aggregated round, which every later
    input (to the step) must share."""

    schema: Schema
    step: str | None = None

    def to(self, journal: Journal) -> None:  # written (and committed) at once
        journal.set_meta(schema_key(self.step), [[n, d, list(s)] for n, d, s in self.schema])


def schema_key(step: str | None) -> str:
    """The journal's meta key of the schema learned for ``step`` (``schema`` without steps)."""
    return "schema" if step is None else f"schema:{step}"


@dataclass
class Effects:
    """What the service does after an event: queue ``writes`` (in order), wake its tasks."""

    writes: list[Write] = field(default_factory=list)  # journal rows (wake the writer)
    statuses: bool = False  # a round's status changed: wake the status publisher
    fetch: bool = False  # the fetch plan may start an attempt: wake the dispatcher
    news: bool = False  # a round may be ready to close: wake the round loop
    give_back: int = 0  # bytes of inputs no longer held, back to the keep budget
    unpin: list[CID] = field(default_factory=list)  # inputs no aggregated round holds
    unspill: list[Path] = field(default_factory=list)  # spill files of inputs let go
    prepare: Gradient | None = None  # get the aggregation kernel ready for inputs like this


@dataclass(frozen=True)
class Order:
    """What one fetch attempt verifies: an announced input and what it must bind to."""

    cid: CID
    claim: Claim
    schema: Schema | None  # the job's (configured or learned); None: any, the majority wins
    clip: bool  # the job clips inputs: measure each input's norm
    step: StepConfig | None = None  # a stepped job's step: the document holds its tensors


@dataclass(frozen=True)
class FetchFailed:
    """An attempt that did not verify: for good (``passing=False``) or for now."""

    reason: str
    passing: bool = False


@dataclass
class Judged:
    """A closing round (or step): who it aggregates, who it excludes and why, or why it fails."""

    round: int
    verified: tuple[str, ...]  # canonical order (sorted by peer id)
    inputs: list[VerifiedInput]  # the verified peers' inputs, in the same order
    excluded: tuple[tuple[str, str], ...]  # (peer, why)
    excluded_cids: list[tuple[str, str, str | None]]  # (peer, why, the CID it announced)
    failure: str | None
    stats: dict[str, Any]
    effects: Effects
    step: str | None = None  # the step of a stepped job
