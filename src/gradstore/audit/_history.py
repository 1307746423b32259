"""verify_history: walk a job's ``prev`` links from a record, verifying every round on the way."""

from __future__ import annotations

from collections.abc import Callable

from ..dag import CID
from ..errors import AuditError
from ..node import Node
from ..store import ByteProgress, GradientStore
from ._records import check_expected, fetch_any_record
from ._round import AnyRoundReport, verify_any_record


async def verify_history(
    node: Node,
    head: CID | str,
    *,
    allow_gaps: bool = False,
    store: GradientStore | None = None,
    on_round: Callable[[AnyRoundReport], None] | None = None,
    coordinator: str | None = None,
    job: str | None = None,
    progress: ByteProgress | None = None,
) -> list[AnyRoundReport]:
    """Verify ``head`` and every record reachable through ``prev``, newest first: round/2-4
    records and stepped rounds' round/5 records alike, in any mix.

    Besides each round's checks: ``job``, ``run`` and ``coordinator`` must agree along the
    chain and
    each ``prev`` must be the round just before (check ``round-sequence``). A coordinator
    writes no record for a failed round, so such a job's chain skips that round number:
    ``allow_gaps`` accepts any strictly decreasing sequence instead. ``coordinator`` and
    ``job`` pin whose records they must be (``check_expected``, on every record).
    """
    store = store or GradientStore(node)
    reports: list[AnyRoundReport] = []
    next_cid: CID | str | None = head
    newer: AnyRoundReport | None = None
    while next_cid is not None:
        rcid, record = await fetch_any_record(node, next_cid)
        check_expected(rcid, record, coordinator, job)
        if newer is not None:
            top = newer.record
            if record.job != top.job:
                raise AuditError(
                    "job",
                    f"record {rcid} (round {record.round}) is of job {record.job!r}, "
                    f"but its successor {newer.record_cid} is of job {top.job!r}",
                )
            if record.run != top.run:
                raise AuditError(
                    "run",
                    f"record {rcid} (round {record.round}) is of run {record.run}, "
                    f"but its successor {newer.record_cid} is of run {top.run}",
                )
            if record.coordinator != top.coordinator:
                raise AuditError(
                    "coordinator",
                    f"record {rcid} (round {record.round}) is signed by "
                    f"{record.coordinator}, its successor {newer.record_cid} by {top.coordinator}",
                )
            ok = record.round < top.round if allow_gaps else record.round == top.round - 1
            if not ok:
                expected = f"below {top.round}" if allow_gaps else str(top.round - 1)
                raise AuditError(
                    "round-sequence",
                    f"record {newer.record_cid} (round {top.round}) links to "
                    f"{rcid}, which is round {record.round}; expected round {expected}",
                )
        report = await verify_any_record(store, rcid, record, progress=progress)
        reports.append(report)
        if on_round is not None:
            on_round(report)
        newer = report
        next_cid = record.prev
    return reports
