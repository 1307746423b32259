"""`gradstore audit population`: every decision re-derived from the recorded scores and seed.

Records are put on a real Kubo daemon; the forged ones are signed by the controller's real
key, so only re-deriving the decision catches them, each with a named check.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from gradstore.audit import verify_population
from gradstore.cli import main
from gradstore.dag.cid import CID, DAG_CBOR
from gradstore.errors import AuditError
from gradstore.node import KuboDaemon
from gradstore.pbt.decide import MemberFailure, decide
from gradstore.population.record import (
    PopulationRecord,
    RecordMember,
    encode_population_record,
)
from gradstore.population.report import decode_report

from .helpers import CONTROLLER, MEMBER_KEYS, ckpt, honest_record, job, report

MEMBERS = [k.did for k in MEMBER_KEYS]


def chain() -> list[PopulationRecord]:
    """Three honest intervals: member 7 never reports in interval 0 and is refilled."""
    config = job()
    assert config.population is not None
    hparams = config.population.first_hparams()
    records: list[PopulationRecord] = []
    prev: CID | None = None
    for interval in range(3):
        scores = {m: float((i * 37 + interval * 11) % 17) / 17 for i, m in enumerate(MEMBERS)}
        failed: tuple[MemberFailure, ...] = ()
        if interval == 0:
            del scores[MEMBERS[7]]
            failed = (MemberFailure(MEMBERS[7], "absent: no report by the deadline"),)
        rec = honest_record(config, interval, scores, hparams, prev=prev, failed=failed)
        prev, _ = encode_population_record(rec, CONTROLLER)
        hparams = rec.hparams_after()
        records.append(rec)
    return records


def put_chain(daemon: KuboDaemon, records: list[PopulationRecord]) -> CID:
    """Put ``records`` (re-linked by ``prev`` in order) on the daemon; the head's CID."""

    async def go() -> CID:
        async with daemon.node() as node:
            prev: CID | None = None
            for rec in records:
                cid, data = encode_population_record(
                    dataclasses.replace(rec, prev=prev), CONTROLLER
                )
                assert await node.put_block(data, DAG_CBOR) == cid
                prev = cid
            assert prev is not None
            return prev

    return asyncio.run(go())


def audit(daemon: KuboDaemon, records: list[PopulationRecord], **kw: Any) -> list[Any]:
    head = put_chain(daemon, records)

    async def go() -> list[Any]:
        async with daemon.node() as node:
            return await verify_population(node, head, **kw)

    return asyncio.run(go())


def failed_check(daemon: KuboDaemon, records: list[PopulationRecord]) -> str:
    with pytest.raises(AuditError) as err:
        audit(daemon, records)
    return err.value.check


def test_an_honest_population_passes(kubo: KuboDaemon) -> None:
    records = chain()
    reports = audit(kubo, records, controller=CONTROLLER.did, job="pbt-test")
    assert [r.record.interval for r in reports] == [2, 1, 0]
    assert MEMBERS[7] in {c.member for c in reports[-1].record.copies}  # refilled by exploit


def _with_copy(rec: PopulationRecord, index: int, **change: Any) -> PopulationRecord:
    copies = list(rec.copies)
    copies[index] = dataclasses.replace(copies[index], **change)
    return dataclasses.replace(rec, copies=tuple(sorted(copies, key=lambda c: c.member)))


def test_a_controller_that_copied_a_worse_member_fails(kubo: KuboDaemon) -> None:
    records = chain()
    rec = records[1]
    ranked = sorted(rec.members, key=lambda m: (m.report.score, m.report.member))
    worse = ranked[len(ranked) // 2 - 1].report  # below the top quantile
    records[1] = _with_copy(rec, 0, source=worse.member, checkpoint=worse.checkpoint)
    assert failed_check(kubo, records) == "population-source"


def test_a_controller_that_perturbed_other_than_recorded_fails(kubo: KuboDaemon) -> None:
    records = chain()
    copy = records[1].copies[0]
    records[1] = _with_copy(records[1], 0, hparams={**copy.hparams, "wd": 0.000123})
    assert failed_check(kubo, records[:2]) == "population-hparams"


def test_a_copy_of_another_checkpoint_fails(kubo: KuboDaemon) -> None:
    records = chain()
    records[2] = _with_copy(records[2], 0, checkpoint=ckpt("elsewhere", 2))
    assert failed_check(kubo, records) == "population-checkpoint"


def test_a_top_member_made_to_copy_fails(kubo: KuboDaemon) -> None:
    records = chain()
    rec = records[2]
    best = max(rec.members, key=lambda m: (m.report.score, m.report.member)).report
    extra = dataclasses.replace(rec.copies[0], member=best.member)
    records[2] = dataclasses.replace(
        rec, copies=tuple(sorted([*rec.copies, extra], key=lambda c: c.member))
    )
    assert failed_check(kubo, records) == "population-targets"


def test_a_score_changed_by_the_controller_fails(kubo: KuboDaemon) -> None:
    records = chain()
    rec = records[0]
    m = rec.members[0]
    changed = RecordMember(dataclasses.replace(m.report, score=0.999), m.report_sig)
    records[0] = dataclasses.replace(rec, members=(changed, *rec.members[1:]))
    assert failed_check(kubo, records) == "member-signature"


def test_a_member_that_trained_with_other_hyperparameters_fails(kubo: KuboDaemon) -> None:
    records = chain()
    rec = records[1]
    m = rec.members[0].report
    other = {**m.hparams, "wd": m.hparams["wd"] * 0.5 + 1e-9}
    rep, sig = decode_report(report(m.member, 1, m.score, other))
    members = (RecordMember(rep, sig), *rec.members[1:])
    records[1] = honest_record(
        job(),
        1,
        {x.report.member: x.report.score for x in members},
        {x.report.member: x.report.hparams for x in members},
    )
    assert failed_check(kubo, records) == "population-lineage"


def test_a_changed_seed_or_a_cut_chain_fails(kubo: KuboDaemon) -> None:
    records = chain()
    rec = records[2]  # a decision honestly re-derived with another seed than the chain's
    scores = [m.report.score_entry for m in rec.members]
    copies = decide(scores, rec.failed, rec.params, run=rec.run, seed=8, interval=2).copies
    records[2] = dataclasses.replace(rec, seed=8, copies=copies)
    assert failed_check(kubo, records) == "seed"
    assert failed_check(kubo, chain()[1:]) == "interval-sequence"


def test_the_cli_audits_a_population(kubo: KuboDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    head = put_chain(kubo, chain())
    capsys.readouterr()
    code = main(
        ["audit", "population", str(head), "--api", kubo.api_url, "--coordinator", CONTROLLER.did]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 4 and lines[-1].startswith("ok population of job pbt-test: 3 decision(s)")
    records = chain()
    records[1] = _with_copy(records[1], 0, hparams={**records[1].copies[0].hparams, "wd": 0.5})
    head = put_chain(kubo, records)
    code = main(["audit", "population", str(head), "--api", kubo.api_url])
    out, err = capsys.readouterr()
    assert code == 1
    assert "check population-hparams failed" in err
