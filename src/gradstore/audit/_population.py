"""verify_population: walk a population's decision records along ``prev`` and re-derive
every decision from the recorded scores, failures, knobs and seed.

Checks, besides the record's own (``record-*``, ``expected-coordinator``, ``expected-job``):
``member-signature`` (every score is its member's signed word), ``population-targets``
(exactly the bottom quantile and the failed members copy), ``population-source`` (each
copies the member the seeded draw picks, never a worse one), ``population-checkpoint`` (the
copied checkpoint is the source's), ``population-hparams`` (the new hyperparameters are the
seeded explore's), and along the chain ``job``, ``run``, ``controller``, ``seed``,
``params``, ``interval-sequence`` and ``population-lineage`` (each member trained the next
interval with the hyperparameters the record before gave it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..dag import CID
from ..errors import AuditError
from ..node import Node
from ..pbt.decide import Decision, decide
from ..population.record import (
    PopulationRecord,
    decode_population_record,
    member_reports_signed,
    params_node,
)
from ._records import _fetch


@dataclass(frozen=True)
class PopulationReport:
    """One verified interval: its record, and the decision re-derived from it."""

    record_cid: CID
    record: PopulationRecord
    decision: Decision


async def fetch_population_record(node: Node, cid: CID | str) -> tuple[CID, PopulationRecord]:
    """Fetch a gradstore/population/1 record: hash, schema and the controller's signature
    checked (``record-cid``, ``record-fetch``, ``record-hash``, ``record-signature``,
    ``record-format``)."""
    return await _fetch(
        node, cid, "population record", lambda data, c: decode_population_record(data, cid=c)
    )


def verify_decision(rcid: CID, rec: PopulationRecord) -> Decision:
    """Re-derive ``rec``'s decision and compare it with what the controller recorded;
    ``AuditError`` naming the first check that fails."""
    where = f"population record {rcid} (interval {rec.interval})"
    forged = member_reports_signed(rec)
    if forged:
        raise AuditError(
            "member-signature",
            f"{where}: the report of {forged[0]} is not signed by it (score or checkpoint altered)",
        )
    try:
        derived = decide(
            [m.report.score_entry for m in rec.members],
            rec.failed,
            rec.params,
            run=rec.run,
            seed=rec.seed,
            interval=rec.interval,
        )
    except ValueError as exc:
        raise AuditError("population-targets", f"{where}: cannot re-derive: {exc}") from exc
    got = {c.member: c for c in rec.copies}
    want = {c.member: c for c in derived.copies}
    if set(got) != set(want):
        raise AuditError(
            "population-targets",
            f"{where}: copies made by {sorted(got)}, but the bottom quantile and failed "
            f"members are {sorted(want)}",
        )
    scores = {m.report.member: m.report for m in rec.members}
    for member, w in want.items():
        g = got[member]
        if g.source != w.source:
            worse = g.source in scores and scores[g.source].score != scores[w.source].score
            raise AuditError(
                "population-source",
                f"{where}: {member} copied {g.source}"
                + (f" (score {scores[g.source].score})" if worse else "")
                + f", the seeded draw picks {w.source} (score {scores[w.source].score})",
            )
        if g.checkpoint != w.checkpoint:
            raise AuditError(
                "population-checkpoint",
                f"{where}: {member} copies checkpoint {g.checkpoint}, {w.source} reported "
                f"{w.checkpoint}",
            )
        if g.hparams != w.hparams:
            raise AuditError(
                "population-hparams",
                f"{where}: {member} was given {g.hparams}, the seeded explore of "
                f"{w.source}'s gives {w.hparams}",
            )
    return derived


def _check_chain(newer: PopulationReport, rcid: CID, rec: PopulationRecord) -> None:
    top = newer.record
    where = f"population record {rcid} (interval {rec.interval})"
    for check, mine, theirs in (
        ("job", rec.job, top.job),
        ("run", rec.run, top.run),
        ("controller", rec.controller, top.controller),
        ("seed", rec.seed, top.seed),
        ("params", params_node(rec.params), params_node(top.params)),
    ):
        if mine != theirs:
            raise AuditError(
                check, f"{where} has {check} {mine!r}, its successor {newer.record_cid} {theirs!r}"
            )
    if rec.interval != top.interval - 1:
        raise AuditError(
            "interval-sequence",
            f"{newer.record_cid} (interval {top.interval}) links to {rcid}, interval "
            f"{rec.interval}",
        )
    after = rec.hparams_after()
    for m in top.members:
        given = after.get(m.report.member)
        if given is not None and given != m.report.hparams:
            raise AuditError(
                "population-lineage",
                f"{m.report.member} trained interval {top.interval} with {m.report.hparams}, "
                f"but {rcid} gave it {given}",
            )


async def verify_population(
    node: Node,
    head: CID | str,
    *,
    controller: str | None = None,
    job: str | None = None,
    on_interval: Callable[[PopulationReport], None] | None = None,
) -> list[PopulationReport]:
    """Verify ``head`` and every decision record before it (newest first), down to interval
    0; ``controller`` and ``job`` pin whose records they must be."""
    reports: list[PopulationReport] = []
    next_cid: CID | str | None = head
    newer: PopulationReport | None = None
    while next_cid is not None:
        rcid, rec = await fetch_population_record(node, next_cid)
        if controller is not None and rec.controller != controller:
            raise AuditError(
                "expected-coordinator",
                f"population record {rcid} is signed by {rec.controller}, not {controller}",
            )
        if job is not None and rec.job != job:
            raise AuditError(
                "expected-job", f"population record {rcid} is of job {rec.job!r}, not {job!r}"
            )
        report = PopulationReport(rcid, rec, verify_decision(rcid, rec))
        if newer is not None:
            _check_chain(newer, rcid, rec)
        reports.append(report)
        if on_interval is not None:
            on_interval(report)
        newer = report
        next_cid = rec.prev
    if reports[-1].record.interval != 0:
        raise AuditError(
            "interval-sequence",
            f"record {reports[-1].record_cid} is interval {reports[-1].record.interval} "
            "and links no record before it",
        )
    return reports
