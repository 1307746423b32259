"""A population job for the tests: 8 member keys, a controller key, reports and records."""

from __future__ import annotations

from typing import Any

from gradstore.dag.cid import CID, RAW
from gradstore.job import JobConfig, parse_job
from gradstore.messages import SigningKey
from gradstore.pbt.decide import MemberFailure, decide
from gradstore.population.record import PopulationRecord, RecordMember
from gradstore.population.report import MemberReport, decode_report, encode_report

RUN = "populationrun01"
LRS = [0.001, 0.003, 0.01, 0.03, 0.1]


def key(i: int) -> SigningKey:
    return SigningKey.from_seed(bytes([i + 1]) * 32)


CONTROLLER = key(100)
MEMBER_KEYS = sorted((key(i) for i in range(8)), key=lambda k: k.did)
BY_DID = {k.did: k for k in MEMBER_KEYS}


def job_raw(n: int = 8, **population: Any) -> dict[str, Any]:
    return {
        "job": "pbt-test",
        "coordinator": CONTROLLER.did,
        "peers": [k.did for k in MEMBER_KEYS[:n]],
        "population": {
            "intervals": 3,
            "interval_steps": 5,
            "seed": 7,
            "hyperparam_mutations": {"lr": LRS, "wd": {"low": 0.0, "high": 0.001}},
            **population,
        },
    }


def job(n: int = 8, **population: Any) -> JobConfig:
    return parse_job(job_raw(n, **population))


def ckpt(member: str, interval: int) -> CID:
    return CID.hash(RAW, f"{member} {interval}".encode())


def report(
    member: str, interval: int, score: float, hparams: dict[str, Any], run: str = RUN
) -> bytes:
    rep = MemberReport(
        "pbt-test", run, interval, member, ckpt(member, interval), score, hparams, 1_700_000_000_000
    )
    return encode_report(rep, BY_DID[member])


def honest_record(
    config: JobConfig,
    interval: int,
    scores: dict[str, float],
    hparams: dict[str, dict[str, Any]],
    prev: CID | None = None,
    failed: tuple[MemberFailure, ...] = (),
) -> PopulationRecord:
    pop = config.population
    assert pop is not None
    members = []
    for m in sorted(scores):
        rep, sig = decode_report(report(m, interval, scores[m], hparams[m]))
        members.append(RecordMember(rep, sig))
    decision = decide(
        [x.report.score_entry for x in members],
        failed,
        pop.params,
        run=RUN,
        seed=pop.seed,
        interval=interval,
    )
    return PopulationRecord(
        job=config.job,
        run=RUN,
        interval=interval,
        seed=pop.seed,
        params=pop.params,
        members=tuple(members),
        failed=failed,
        copies=decision.copies,
        prev=prev,
        controller=config.coordinator,
    )
