"""The coordinator's signed statuses and results, built from a round's book: pure, no I/O.

A status tells every peer of the job, in one message, whose input the round holds, which
are verified, and which it refused and why; a result names the aggregated peers. Peer
sets are bitmaps over the job's roster; lists too long for a message move to a linked
block (``messages.encode_fitted``), so they fit at any number of peers.
"""

from __future__ import annotations

from ..messages import Result, Roster, RoundRecord, Status, shorten
from .rounds import PeerState, RoundBook


def status_of(
    book: RoundBook, roster: Roster, *, job: str, run: str, sent_at: int, failed: str | None = None
) -> Status:
    """The status of ``book``'s round as of now."""
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
        received=roster.bitmap(received),
        verified=roster.bitmap(verified),
        refused=roster.bitmap(refused),
        reasons=tuple(shorten(book.refusals[p]) for p in refused),
        sent_at=sent_at,
        failed=None if failed is None else shorten(failed),
    )


def result_of(record: RoundRecord, record_cid: str, roster: Roster, *, sent_at: int) -> Result:
    """The result message announcing ``record``'s round."""
    return Result(
        job=record.job,
        run=record.run,
        round=record.round,
        cid=str(record.output),
        record=record_cid,
        method=record.method,
        peers=roster.bitmap(i.peer for i in record.inputs),
        sent_at=sent_at,
    )
