"""The coordinator's signed statuses and results, built from a round's book: pure, no I/O.

A status tells every peer of the job, in one message, whose input the round holds, which
are verified, and which it refused and why; a result names the aggregated peers. Peer
sets are bitmaps over the job's roster; lists too long for a message move to a linked
block (``messages.encode_fitted``), so they fit at any number of peers. In a stepped job
each step has its own status and result (``step`` set), and the round's result (no step)
names the round/5 record, the model-level output and every peer aggregated in a step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..messages import PartialRecord, Result, Roster, RoundRecord, Status, StepRecord, shorten
from .rounds import PeerState, RoundBook


def status_of(
    book: RoundBook,
    roster: Roster,
    *,
    job: str,
    run: str,
    sent_at: int,
    failed: str | None = None,
    deadline: float | None = None,
) -> Status:
    """The status of ``book``'s round (its step's, in a stepped job) as of now; ``deadline``
    (unix seconds, the clock of ``sent_at``) is when the open round's deadline falls."""
    slots = book.slots
    received = [p for p, s in slots.items() if s.state != PeerState.PENDING]
    verified = [
        p for p, s in slots.items() if s.state in (PeerState.VERIFIED, PeerState.AGGREGATED)
    ]
    refused = sorted(p for p in book.refusals if p in roster)
    return Status(
        job=job,
        run=run,
        round=book.round,
        step=book.step,
        received=roster.bitmap(received),
        verified=roster.bitmap(verified),
        refused=roster.bitmap(refused),
        reasons=tuple(shorten(book.refusals[p]) for p in refused),
        sent_at=sent_at,
        deadline=None if deadline is None else int(deadline * 1000),
        failed=None if failed is None else shorten(failed),
    )


@dataclass(frozen=True)
class Announced:
    """What a result message says: a round's (or a step's) output and record, its method
    and the peers aggregated. The beacon re-stamps and re-signs it."""

    job: str
    run: str
    round: int
    step: str | None
    output: str
    record: str
    method: str
    peers: tuple[str, ...]

    @classmethod
    def of(cls, record: RoundRecord | StepRecord | PartialRecord, record_cid: str) -> Announced:
        """The result of a round/4 record, of a step record (``step`` set), or of a tree
        leaf's partial record (what its group closed into)."""
        return cls(
            record.job,
            record.run,
            record.round,
            record.step,
            str(record.output),
            record_cid,
            record.method,
            tuple(i.peer for i in record.inputs),
        )

    @classmethod
    def of_steps(cls, record_cid: str, output: str, steps: Iterable[Announced]) -> Announced:
        """The result of a stepped round: its round/5 record and model-level output, the
        steps' distinct methods joined with ``+`` and every peer aggregated in a step."""
        steps = list(steps)
        methods = list(dict.fromkeys(s.method for s in steps))
        peers = sorted({p for s in steps for p in s.peers})
        first = steps[0]
        return cls(
            first.job,
            first.run,
            first.round,
            None,
            output,
            record_cid,
            "+".join(methods),
            tuple(peers),
        )


def result_of(
    record: RoundRecord | Announced, record_cid: str, roster: Roster, *, sent_at: int
) -> Result:
    """The result message announcing ``record``'s round (or step)."""
    done = record if isinstance(record, Announced) else Announced.of(record, record_cid)
    return Result(
        job=done.job,
        run=done.run,
        round=done.round,
        step=done.step,
        cid=done.output,
        record=done.record,
        method=done.method,
        peers=roster.bitmap(done.peers),
        sent_at=sent_at,
    )


def said_by(status: Status, result: Result) -> bool:
    """Whether ``result`` says all that ``status``, its step's (round's) status at the close,
    would: every peer received was verified and aggregated, none refused, nothing failed.
    Such a status is not sent before its result (a peer reads "verified" off the result)."""
    return (
        status.failed is None
        and (status.round, status.step) == (result.round, result.step)
        and status.received == status.verified == result.peers
        and not any(status.refused)
    )
