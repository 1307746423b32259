"""The controller's side of one interval, a thin asyncio shell over the pure decision.

It collects the members' reports from the job's report topic until every member has
reported or the deadline passes, verifies each reported checkpoint block by block through
``GradientStore.verify``, fails the members that did not report (``absent``) or whose
checkpoint does not verify (``unavailable``, ``integrity``, ``malformed``), decides
(``decide``), stores and pins the signed record, and publishes the next interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..dag.cid import CID, DAG_CBOR
from ..errors import FormatError, IntegrityError, MessageError, NodeError, Reason, reason_text
from ..job._population import PopulationConfig
from ..messages.keys import SigningKey
from ..node import Node, Subscription
from ..pbt.decide import MemberFailure, decide
from ..pbt.space import HValue
from ..store import GradientStore
from .next import NextInterval, encode_next
from .record import PopulationRecord, RecordMember, encode_population_record
from .report import MemberReport, verify_report


def population_topics(job: str) -> tuple[str, str]:
    """The pubsub topics of a population job: (members' reports, controller's next-interval)."""
    return f"gradstore/v1/{job}/population/reports", f"gradstore/v1/{job}/population/next"


@dataclass
class IntervalResult:
    """What one interval produced: the stored record, and the reports refused on the way."""

    record_cid: CID
    record: PopulationRecord
    refused: list[str] = field(default_factory=list)
    #: The signed next-interval message published at the end (a service re-sends it).
    next_message: bytes = b""


async def _collect(
    sub: Subscription,
    *,
    job: str,
    run: str,
    interval: int,
    pop: PopulationConfig,
    deadline_s: float,
    refused: list[str],
) -> dict[str, tuple[MemberReport, bytes]]:
    reports: dict[str, tuple[MemberReport, bytes]] = {}
    end = time.monotonic() + deadline_s
    while len(reports) < len(pop.members):
        remaining = end - time.monotonic()
        if remaining <= 0:
            break
        try:
            msg = await sub.get(timeout=remaining)
        except TimeoutError:
            break
        try:
            rep, sig = verify_report(
                msg.data,
                job=job,
                run=run,
                interval=interval,
                members=pop.members,
                params=pop.params,
            )
        except MessageError as exc:
            refused.append(str(exc))
            continue
        reports.setdefault(rep.member, (rep, sig))  # a member's first report stands
    return reports


async def _check_checkpoint(store: GradientStore, cid: CID, timeout_s: float) -> str | None:
    """None if ``cid`` is a checkpoint every block of which verifies, else a reason text."""
    try:
        await asyncio.wait_for(store.verify(cid), timeout_s)
    except TimeoutError:
        return reason_text(Reason.UNAVAILABLE, f"checkpoint {cid} not fetched in {timeout_s} s")
    except IntegrityError as exc:
        return reason_text(Reason.INTEGRITY, str(exc))
    except FormatError as exc:
        return reason_text(Reason.MALFORMED, f"checkpoint {cid}: {exc}")
    except NodeError as exc:
        return reason_text(Reason.UNAVAILABLE, f"checkpoint {cid}: {exc}")
    return None


async def run_interval(
    node: Node,
    sub: Subscription,
    pop: PopulationConfig,
    key: SigningKey,
    *,
    job: str,
    run: str,
    interval: int,
    prev: CID | None,
    hparams: Mapping[str, Mapping[str, HValue]],
    fetch_timeout_s: float = 30.0,
) -> IntervalResult:
    """Collect, verify, decide, store and publish one interval; ``sub`` is a live
    subscription to the report topic and ``hparams`` what each member was told to train
    with (a report that trained otherwise is failed ``malformed``)."""
    refused: list[str] = []
    reports = await _collect(
        sub,
        job=job,
        run=run,
        interval=interval,
        pop=pop,
        deadline_s=pop.deadline_s,
        refused=refused,
    )
    store = GradientStore(node)
    members: list[RecordMember] = []
    failures: list[MemberFailure] = []
    for member in pop.members:
        got = reports.get(member)
        if got is None:
            failures.append(
                MemberFailure(member, reason_text(Reason.ABSENT, "no report by the deadline"))
            )
            continue
        rep, sig = got
        problem = await _check_checkpoint(store, rep.checkpoint, fetch_timeout_s)
        if problem is None and dict(hparams.get(member, rep.hparams)) != rep.hparams:
            problem = reason_text(Reason.MALFORMED, "trained with other hyperparameters than given")
        if problem is None:
            members.append(RecordMember(rep, sig))
        else:
            failures.append(MemberFailure(member, problem, str(rep.checkpoint)))
    decision = decide(
        [m.report.score_entry for m in members],
        failures,
        pop.params,
        run=run,
        seed=pop.seed,
        interval=interval,
    )
    record = PopulationRecord(
        job=job,
        run=run,
        interval=interval,
        seed=pop.seed,
        params=pop.params,
        members=tuple(members),
        failed=tuple(failures),
        copies=decision.copies,
        prev=prev,
        controller=key.did,
    )
    cid, data = encode_population_record(record, key)
    stored = await node.put_block(data, DAG_CBOR)
    if stored != cid:
        raise IntegrityError(cid, f"the node stored the record as {stored}")
    await node.pin(cid, recursive=False)
    next_msg = NextInterval(job, run, interval + 1, cid, int(time.time() * 1000))
    next_data = encode_next(next_msg, key)
    await node.publish(population_topics(job)[1], next_data)
    return IntervalResult(cid, record, refused, next_data)
