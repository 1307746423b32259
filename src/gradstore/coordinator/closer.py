"""Closing a round's steps and the round, and resuming them after a restart: the part of
``Coordinator`` that stores, journals, then publishes, in that order.

Each step (a job without steps: its one step, which is the round) closes on its own, as
soon as ``state.due`` says so, on a task of its own (steps due together close
concurrently): it is judged, aggregated with its own method and stored
(``closing.close_round``), journaled, and only then its status and result are published;
its inputs' memory goes back at once. Steps partition the tensors, so concurrent closes
hold at most the model's aggregate besides the inputs already under the fetch budget; the
journal is one connection whose flushes take turns. A stepped round then ends once every step closed or
failed: the model-level output (every closed step's tensors) and a round/5 record linking
the steps' records are stored, journaled and published as the round's result. Every step
failed: the round fails, with no record. A restart reads the records it must re-publish
(``recover``), and the steps of the open round that were over before stay over.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from ..dag import CID
from ..errors import (
    AggregationError,
    AssemblyError,
    LimitExceededError,
    MessageError,
    NodeError,
    Reason,
    ReplicationError,
    reason_text,
)
from ..job import JobConfig
from ..messages import (
    RoundStep,
    SigningKey,
    SteppedRoundRecord,
    StepRecord,
    decode_partial_record,
    decode_record,
    decode_step_record,
    decode_stepped_record,
    encode_stepped_record,
    model_meta,
)
from ..node import Node
from ..store import GradientStore, put_model
from .closing import Closed, close_round, put_record, with_retries
from .effects import Effects, Judged, schema_key
from .held import HeldOutputs
from .journal import Journal
from .outcome import RoundOutcome, format_outcome
from .partial import close_partial
from .rounds import RoundBook
from .spill import SpillDir
from .state import CoordinatorState, StepDone
from .statuses import Announced, result_of, said_by
from .steps import Key, key_step

log = logging.getLogger("gradstore.coordinator")


class Closer:
    """Closes steps and rounds for ``Coordinator`` (which has every attribute named here)."""

    config: JobConfig
    key: SigningKey
    node: Node
    store: GradientStore
    state: CoordinatorState
    close_retry_s: float
    clock: Callable[[], float]
    _attempts: dict[Key, asyncio.Task[None]]
    _spills: SpillDir | None
    _held: HeldOutputs  # closed steps' outputs, for the round's model-level output

    @property
    def journal(self) -> Journal:
        raise NotImplementedError

    def _apply(self, effects: Effects) -> Effects:
        raise NotImplementedError

    async def _publish(self, msg: Any) -> None:
        raise NotImplementedError

    def _stamp(self) -> int:
        raise NotImplementedError

    # -- a step ----------------------------------------------------------------------------
    async def _close_step(self, book: RoundBook) -> RoundOutcome:
        """Judge, aggregate, store, journal and publish one step (or a round without steps)."""
        t_close = time.perf_counter()
        r, step = book.round, book.step
        for key in [k for k in self._attempts if k[0] == r and key_step(k) == step]:
            self._attempts[key].cancel()
        judged = self.state.judge(book, self.clock())
        self._apply(judged.effects)
        if judged.failure is not None:
            outcome = await self._fail(judged, judged.failure)
        else:
            try:
                close = close_round if self.config.group is None else close_partial
                closed = await close(
                    self.config,
                    self.key,
                    self.node,
                    self.store,
                    run=self.state.run_id,
                    round_=r,
                    inputs=judged.inputs,
                    excluded=judged.excluded_cids,
                    prev=self.state.head,
                    announcements=self.journal.signatures(r, judged.verified, step),
                    give_up_after=self.close_retry_s,
                    step=None if step is None else self.state.steps[step],
                )
            except AggregationError as exc:
                outcome = await self._fail(judged, f"aggregation refused: {exc}")
            except ReplicationError as exc:  # retried for close_retry_s: the cluster is short
                outcome = await self._fail(judged, reason_text(Reason.REPLICATION, str(exc)))
            else:
                outcome = await self._closed(judged, closed, t_close)
        await self._unpin(self.state.release_step(r, step))
        if step is not None:
            self.journal.set_step_stats(r, step, outcome.stats)
            log.info("%s", format_outcome(outcome))
        return outcome

    async def _closed(self, judged: Judged, closed: Closed, t_close: float) -> RoundOutcome:
        r, step = judged.round, judged.step
        self._apply(self.state.close_succeeded(r, closed, step))
        await asyncio.to_thread(self.journal.flush)  # durable before announcing
        # its last word, before the result is announced (the beacon repeats an announced
        # result: it must not overtake the status), unless the result says it all (64
        # messages fewer in a clean 64-step round)
        status = self.state.status(r, self._stamp(), step=step)
        announced = Announced.of(closed.record, str(closed.record_cid))
        result = result_of(announced, announced.record, self.config.roster, sent_at=self._stamp())
        if status is not None and not said_by(status, result):
            await self._publish(status)
        # the result the state repeats from now on, stamped as it goes
        if isinstance(closed.record, StepRecord) and step is not None:
            if closed.aggregate is not None and self.state.steps.root:
                self._held.hold(r, closed.output, closed.aggregate)
            self.state.announce_step_result(closed.record, closed.record_cid)
            await self._publish(dataclasses.replace(result, sent_at=self._stamp()))
            self.journal.mark_step_published(r, step)
        else:
            self.state.announce_result(announced, closed.record_cid)
            await self._publish(dataclasses.replace(result, sent_at=self._stamp()))
            self.journal.mark_published(r)
        stats = judged.stats | closed.stats
        stats["publish_s"] = stats.pop("store_s", 0.0)
        stats["close_s"] = round(time.perf_counter() - t_close, 3)
        peers = tuple(i.peer for i in closed.record.inputs)
        return RoundOutcome(
            r, "closed", closed.output, closed.record_cid, peers, judged.excluded, None, stats, step
        )

    async def _fail(self, judged: Judged, reason: str) -> RoundOutcome:
        r, step = judged.round, judged.step
        self._apply(self.state.close_failed(r, reason, step))
        await asyncio.to_thread(self.journal.flush)
        self.state.announce_failure(r, reason, step)
        await self._publish(self.state.status(r, self._stamp(), failed=reason, step=step))
        return RoundOutcome(
            r, "failed", None, None, (), judged.excluded, reason, judged.stats, step
        )

    async def _unpin(self, effects: Effects) -> None:
        for cid in self._apply(effects).unpin:
            with contextlib.suppress(NodeError):
                await self.node.unpin(cid)

    # -- the round -------------------------------------------------------------------------
    async def _finish_round(self, round_: int, steps: list[RoundOutcome]) -> RoundOutcome:
        """Every step of ``round_`` is over: end the round (a stepped one: its model-level
        output and round/5 record) and move on."""
        first = self.state.book(round_, next(iter(self.state.steps)))
        assert first is not None
        started = first.started_at or first.opened_at
        if not self.state.steps.root:  # the root combines the steps: no record here
            outcome = await self._part_done(round_, steps)
        elif self.state.steps.stepped:
            outcome = await self._close_stepped(round_, steps)
        else:
            (outcome,) = steps
        self._held.drop(round_)
        await self._unpin(self.state.forget(round_, keep_pins=outcome.status == "closed"))
        if self._spills is not None:  # the round is recorded (or failed): its folder goes
            await asyncio.to_thread(self._spills.drop_round, round_)
        # from the first accepted announcement (when the round's clock started) to the end
        outcome.stats["started_s"] = round(self.clock() - started, 3)
        return outcome

    async def _part_done(self, round_: int, steps: list[RoundOutcome]) -> RoundOutcome:
        """At an owner that is not the root, every step it owns is over: the round ends
        here with no output or record of its own (the root writes them), journaled."""
        done = self.state.round_steps(round_)
        excluded = tuple((p, f"{o.step}: {why}") for o in steps for p, why in o.excluded)
        now = self.state.stats()
        stats: dict[str, Any] = {"steps": _step_counts(done), "peers": now["peers"]}
        peers = tuple(sorted({p for o in steps for p in o.peers}))
        if any(d.result is not None for d in done):
            self._apply(self.state.round_closed(round_, None, None))
            status, reason = "closed", None
        else:
            reason = "every step failed: " + "; ".join(f"{d.step}: {d.failed}" for d in done)
            self._apply(self.state.close_failed(round_, reason))
            status = "failed"
        self.journal.mark_published(round_)  # nothing of its own to publish
        await asyncio.to_thread(self.journal.flush)
        return RoundOutcome(
            round_, status, None, None, peers, excluded, reason, stats, None, tuple(steps)
        )

    async def _close_stepped(self, round_: int, steps: list[RoundOutcome]) -> RoundOutcome:
        done = self.state.round_steps(round_)
        excluded = tuple((p, f"{o.step}: {why}") for o in steps for p, why in o.excluded)
        now = self.state.stats()  # the round is still open: who took part in it
        stats: dict[str, Any] = {
            "steps": _step_counts(done),
            "peers": now["peers"],
            "bytes_fetched": self.state.bytes_fetched,
        }
        closed = [d for d in done if d.result is not None]
        if not closed:
            reason = "every step failed: " + "; ".join(f"{d.step}: {d.failed}" for d in done)
            return await self._round_failed(round_, reason, excluded, stats)
        t0 = time.perf_counter()
        cfg, run = self.config, self.state.run_id
        outputs = [CID.parse(d.result.output) for d in closed if d.result is not None]
        meta = model_meta(cfg.job, round_, [str(d.step) for d in closed], outputs, run=run)
        try:
            model = await with_retries(
                "storing the model-level output",
                partial(put_model, self.store, outputs, meta, held=self._held.of(round_)),
                give_up_after=self.close_retry_s,
            )
        except (AssemblyError, LimitExceededError) as exc:  # e.g. a model over the job's limits
            reason = f"the model-level output cannot be assembled: {exc}"
            return await self._round_failed(round_, reason, excluded, stats)
        record = SteppedRoundRecord(
            job=cfg.job,
            run=run,
            round=round_,
            steps=tuple(_round_step(d, self.state.steps.others.get(str(d.step))) for d in done),
            output=model,
            prev=self.state.head,
            coordinator=cfg.coordinator,
        )
        record_cid, data = encode_stepped_record(record, self.key)
        await put_record(
            node=self.node, cid=record_cid, data=data, give_up_after=self.close_retry_s
        )
        self._apply(self.state.round_closed(round_, model, record_cid))
        await asyncio.to_thread(self.journal.flush)
        result = self.state.round_result(round_, model, record_cid)
        self.state.announce_result(result, record_cid)
        await self._publish(self.state.result(self._stamp()))
        self.journal.mark_published(round_)
        stats["publish_s"] = round(time.perf_counter() - t0, 3)
        return RoundOutcome(
            round_,
            "closed",
            model,
            record_cid,
            result.peers,
            excluded,
            None,
            stats,
            None,
            tuple(steps),
        )

    async def _round_failed(
        self,
        round_: int,
        reason: str,
        excluded: tuple[tuple[str, str], ...],
        stats: dict[str, Any],
    ) -> RoundOutcome:
        """A stepped round ends without a record: journaled, then its status (no step)."""
        self._apply(self.state.close_failed(round_, reason))
        await asyncio.to_thread(self.journal.flush)
        self.state.announce_failure(round_, reason)
        await self._publish(self.state.failure(self._stamp()))
        return RoundOutcome(round_, "failed", None, None, (), excluded, reason, stats)

    # -- a restart -------------------------------------------------------------------------
    async def _recover(self) -> None:
        """Resume from the journal: head record, current round (and its steps that were
        over), unpublished results."""
        journal, state = self.journal, self.state
        rows = journal.rounds()
        schemas = {s: journal.get_meta(schema_key(s)) for s in state.steps if s is not None}
        for r, cid, publish in state.recovered(rows, journal.get_meta("schema"), schemas):
            done = await read_result(self.node, cid, stepped=state.steps.stepped)
            state.announce_result(done, cid)
            if publish:
                await self._publish(state.result(self._stamp()))
                journal.mark_published(r)
        for step, cid, publish in state.recovered_steps(journal.steps(state.round)):
            state.announce_step_result(await _read(self.node, cid, decode_step_record), cid)
            if publish:
                await self._publish(state.step_result(step, self._stamp()))
                journal.mark_step_published(state.round, step)
        state.remember(journal.inputs_from(state.round))
        journal.flush()
        if rows:
            job, run, r, head = self.config.job, state.run_id, state.round, state.head
            log.info("resuming job %s run %s at round %d (head record %s)", job, run, r, head)


async def read_result(node: Node, cid: CID, *, stepped: bool) -> Announced:
    """What the result of the round whose record is ``cid`` says: a round/4 record's, or
    (``stepped``: a stepped job's) a round/5 record's, whose steps' records are read for
    their methods and peers."""
    data = await with_retries(f"reading round record {cid}", partial(node.get_block, cid))
    if not stepped:
        try:
            return Announced.of(decode_record(data, cid=cid), str(cid))
        except MessageError:  # a tree leaf's round: its partial record
            return Announced.of(decode_partial_record(data, cid=cid), str(cid))
    record = decode_stepped_record(data, cid=cid)
    steps = []
    for entry in record.steps:
        if entry.record is not None:
            step = await _read(node, entry.record, decode_step_record)
            steps.append(Announced.of(step, str(entry.record)))
    return Announced.of_steps(str(cid), str(record.output), steps)


async def _read(node: Node, cid: CID, decode: Callable[..., StepRecord]) -> StepRecord:
    data = await with_retries(f"reading record {cid}", partial(node.get_block, cid))
    return decode(data, cid=cid)


def _round_step(done: StepDone, owner: str | None = None) -> RoundStep:
    """The round/5 entry of ``done``; ``owner``: its coordinator, when not the root."""
    assert done.step is not None
    if done.result is None:
        return RoundStep(done.step, failed=done.failed or "failed", coordinator=owner)
    return RoundStep(
        done.step,
        record=CID.parse(done.result.record),
        output=CID.parse(done.result.output),
        coordinator=owner,
    )


def _step_counts(done: list[StepDone]) -> dict[str, int]:
    failed = sum(d.failed is not None for d in done)
    return {"total": len(done), "completed": len(done) - failed, "failed": failed, "pending": 0}
