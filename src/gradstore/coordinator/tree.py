"""The root of a tree round (docs/design/multicoord.md, "The tree by peer groups"): it hears
each group's leaf on the group's results topic, takes the partials they sign, and combines
them into the round's output and its ``gradstore/tree/1`` record.

The root admits no announcement: the leaves do (each a ``Coordinator`` over its group's
view of the job, closing into a partial record, ``coordinator.partial``). The root says
its run on the job's results topic (a status of its open round, repeated, which the leaves
adopt); it publishes the round's result there and on every group's results topic, where
the group's peers wait for it. The decisions are ``tree_state``'s.

Restart: each part taken (its partial record's CID) and each failure a leaf said is
journaled as the group's row of the open round (the journal's ``steps`` table, keyed by
the group's name). A root restarted mid-round re-fetches the journaled partial records and
documents from the network (they are the leaves', content-addressed), so it does not
depend on a leaf still repeating its result; the round's clock starts again at the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..aggregate import aggregate_partials, partial_limits
from ..dag import CID
from ..errors import (
    AggregationError,
    ConfigError,
    FormatError,
    IntegrityError,
    LimitExceededError,
    MessageError,
    NodeError,
)
from ..format import Gradient
from ..job import GroupConfig, JobConfig
from ..messages import (
    Result,
    SigningKey,
    Status,
    TreeRecord,
    aggregate_meta,
    decode_partial_record,
    decode_tree_record,
    encode_fitted,
    encode_tree_record,
    shorten,
    verify_message,
)
from ..node import Node, follow
from ..store import GradientStore
from ._tasks import relay, until
from .closing import DEFAULT_CLOSE_RETRY_S, put_record, with_retries
from .journal import Journal, RoundRow
from .outcome import RoundOutcome, format_outcome
from .tree_state import TreeRound, check_remote_partial, checked_part

log = logging.getLogger("gradstore.coordinator")


class TreeRoot:
    """Runs the rounds of a tree job (``config.groups``) as its root (``key``: the job's
    coordinator), over one node and a state folder of its own."""

    def __init__(
        self,
        config: JobConfig,
        key: SigningKey,
        node: Node,
        state_dir: str | Path,
        *,
        resolve_timeout_s: float = 10.0,
        rebroadcast_s: float = 2.0,
        linger_s: float = 3.0,
        close_retry_s: float = DEFAULT_CLOSE_RETRY_S,
        on_round: Callable[[RoundOutcome], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not config.tree or config.group is not None:
            raise ConfigError(f"job {config.job!r} is not a tree by peer groups ([[groups]])")
        if key.did != config.coordinator:
            raise ConfigError(
                f"the key's id {key.did} is not the job's coordinator {config.coordinator}, "
                "the tree's root"
            )
        self.config = config
        self._groups = {g.name: g for g in config.groups}
        self.key = key
        self.node = node
        self.state_dir = Path(state_dir)
        self.store = GradientStore(node, limits=partial_limits(config.limits))
        self.resolve_timeout_s = resolve_timeout_s
        self.rebroadcast_s = rebroadcast_s
        self.linger_s = linger_s
        self.close_retry_s = close_retry_s
        self.on_round = on_round
        self.clock = clock
        self.outcomes: list[RoundOutcome] = []
        self.run_id = ""
        self.round = 0
        self.head: CID | None = None
        self._book: TreeRound | None = None
        self._journal: Journal | None = None
        self._news = asyncio.Event()
        self._said: list[tuple[str, Any]] = []  # (topic, message) the beacon repeats
        self._last: list[tuple[str, Any]] = []  # what the last round's end said, repeated too
        self._reads: set[tuple[int, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: a leaf's word about a round the root has not opened yet (it moved on sooner)
        self._early: dict[tuple[int, str], Result | Status] = {}

    # -- lifecycle -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> list[RoundOutcome]:
        """Run rounds until ``rounds.count`` are done (or ``stop`` is set)."""
        stop = stop or asyncio.Event()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with Journal(self.state_dir / "journal.sqlite") as journal:
            self._journal = journal
            self.run_id = journal.bind(self.config.job, self.key.did)
            ended = [row for row in journal.rounds() if row.state in ("closed", "failed")]
            for row in ended:  # resume after the last round that ended
                if row.state == "closed" and row.record is not None:
                    self.head = CID.parse(row.record)
                self.round = row.round + 1
            if ended:
                await self._said_again(ended[-1])
            async with asyncio.TaskGroup() as tg:
                background = [
                    tg.create_task(self._hear(g), name=f"tree-group-{g.name}")
                    for g in self.config.groups
                ]
                background.append(tg.create_task(self._beacon(), name="tree-beacon"))
                background.append(tg.create_task(relay(stop, self._news), name="tree-stop"))
                try:
                    await self._rounds(journal, stop)
                    if not stop.is_set() and self.linger_s > 0:
                        await until(stop, self.linger_s)  # late peers see the last result
                finally:
                    for task in (*background, *self._tasks):
                        task.cancel()
        return self.outcomes

    async def _rounds(self, journal: Journal, stop: asyncio.Event) -> None:
        count = self.config.rounds.count
        while (count == 0 or self.round < count) and not stop.is_set():
            r = self.round
            journal.open_round(r, opened_at=self.clock())
            book = self._book = TreeRound(self.config, r, self.close_retry_s)
            status = self._status(r)
            self._said = [*self._last, (self.config.results_topic, status)]
            await self._say(self.config.results_topic, status)
            self._resume(journal, book)
            for g in self.config.groups:
                early = self._early.pop((r, g.name), None)
                if early is not None:
                    self._take(g, early, book)
            while not book.done and not stop.is_set():
                self._news.clear()
                silent, wake = book.due(self.clock())
                for group, reason in silent:
                    log.warning("round %d group %s: %s", r, group, reason)
                    book.fail(group, reason)
                if book.done:
                    break
                left = None if wake is None else max(0.0, wake - self.clock())
                await until(self._news, left)
            if not book.done:
                return  # stopped: the round stays open in the journal
            outcome = await self._finish(journal, book)
            self.outcomes.append(outcome)
            log.info("%s", format_outcome(outcome))
            if self.on_round is not None:
                self.on_round(outcome)
            self.round = r + 1

    # -- hearing the leaves ----------------------------------------------------------------
    async def _hear(self, group: GroupConfig) -> None:
        """Read ``group``'s results topic: its leaf's statuses (the round's clock, a failure)
        and results (the partial record to take)."""
        view = self.config.group_view(group.name)
        async with self.node.subscribe(view.results_topic) as sub:
            async for msg in follow(self.node, sub):
                try:
                    parsed = verify_message(
                        msg.data, job=view.job, coordinator=group.coordinator, peers=view.roster
                    )
                except MessageError:
                    continue  # our own results, a peer's junk: not the leaf's word
                if not isinstance(parsed, Result | Status) or parsed.run != self.run_id:
                    continue
                book = self._book
                if parsed.step is not None:
                    continue
                if book is None or parsed.round > book.round:
                    if isinstance(parsed, Result) or parsed.failed is not None:
                        self._early[parsed.round, group.name] = parsed
                    continue
                if parsed.round == book.round:
                    self._take(group, parsed, book)

    def _take(self, group: GroupConfig, said: Result | Status, book: TreeRound) -> None:
        """What ``group``'s leaf said of the open round: its clock starts; a failure fails
        the group; a result's partial is fetched and checked (``_read``)."""
        if book.started_at is None:  # the round's clock starts: the loop looks at it
            book.heard(self.clock())
            self._news.set()
        if not book.wants(group.name):
            return
        if isinstance(said, Status):
            if said.failed is not None:
                book.fail(group.name, said.failed)
                if self._journal is not None:  # a restart keeps the leaf's word
                    self._journal.fail_step(book.round, group.name, said.failed)
                    self._journal.flush()
                self._news.set()
            return
        self._reading(group, said.round, said.record, book, said)

    def _resume(self, journal: Journal, book: TreeRound) -> None:
        """A restart mid-round: the groups journaled in ``book``'s round are over again,
        each taken part re-fetched by its partial record's CID (``_read``)."""
        rows = [row for row in journal.steps(book.round) if row.step in self._groups]
        for row in rows:
            if row.state == "failed":
                book.fail(row.step, row.reason or "failed")
            elif row.record is not None:
                self._reading(self._groups[row.step], book.round, row.record, book, None)
        if rows:
            log.info("round %d: resumed %d group(s) from the journal", book.round, len(rows))
            book.heard(self.clock())  # the clock starts again: the others get a full deadline

    def _reading(
        self, group: GroupConfig, r: int, record: str, book: TreeRound, result: Result | None
    ) -> None:
        """Read the partial ``record`` of ``group`` in round ``r`` once at a time (``_read``)."""
        at = (r, group.name)
        if at not in self._reads:
            self._reads.add(at)
            task = asyncio.create_task(self._read(group, r, record, book, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read(
        self, group: GroupConfig, r: int, record_cid: str, book: TreeRound, result: Result | None
    ) -> None:
        """Fetch and check the partial record and document the leaf's ``result`` names (None:
        one journaled when it was taken, checked then); the group's part is taken once they
        hold (else its leaf's next repeat tries again), and journaled."""
        try:
            cid = CID.parse(record_cid)
            record = decode_partial_record(await self._block(cid), cid=cid)
            if result is not None:
                check_remote_partial(
                    result, cid, record, group=group, job=self.config.job, run=self.run_id
                )
            document = await asyncio.wait_for(
                self.store.get(record.output), self.resolve_timeout_s * 6
            )
            part = checked_part(record, cid, document.tensors, document.meta)
        except (
            MessageError,
            IntegrityError,
            NodeError,
            TimeoutError,
            AggregationError,
            FormatError,
            LimitExceededError,
        ) as exc:
            log.warning(
                "round %d group %s: the %s is not taken: %s",
                r,
                group.name,
                "result of its leaf" if result is not None else "journaled partial record",
                exc,
            )
        else:
            if book.wants(group.name) and self._journal is not None:
                self._journal.close_step(r, group.name, str(record.output), str(cid))
                self._journal.flush()  # a restart re-reads it from the network
            book.took(group.name, part)
            log.info("round %d group %s: took partial record %s", r, group.name, cid)
            self._news.set()
        finally:
            self._reads.discard((r, group.name))

    # -- the round's end -------------------------------------------------------------------
    async def _finish(self, journal: Journal, book: TreeRound) -> RoundOutcome:
        """Combine the closed groups' partials, store the output and the tree record, journal
        them, then publish the result (a round with no closed group fails, no record)."""
        t0 = time.perf_counter()
        cfg, r = self.config, book.round
        plan = book.plan()
        failed = {} if plan is None else dict(plan.failed)
        stats: dict[str, Any] = {"groups": {"total": len(cfg.groups)}}
        if plan is None or not plan.parts:
            why = "; ".join(f"{g}: {w}" for g, w in {**book.failed, **failed}.items())
            return await self._fail(journal, r, f"every group failed: {why}", stats)
        try:
            tensors, _ = await asyncio.to_thread(
                aggregate_partials,
                [p.partial for _, p in plan.parts],
                plan.layout,
                plan.aggregation,
                plan.samples,
            )
        except AggregationError as exc:
            return await self._fail(journal, r, f"aggregation refused: {exc}", stats)
        cids = [i.gradient for i in plan.inputs]
        meta = aggregate_meta(cfg.job, r, cfg.method, cids, run=self.run_id)
        output = await with_retries(
            "storing the round's output",
            lambda: self.store.put(Gradient(tensors, meta)),
            give_up_after=self.close_retry_s,
        )
        record = TreeRecord(
            job=cfg.job,
            run=self.run_id,
            round=r,
            method=cfg.method,
            params=plan.params,
            groups=book.entries(failed),
            output=output,
            prev=self.head,
            coordinator=self.key.did,
        )
        record_cid, data = encode_tree_record(record, self.key)
        await put_record(self.node, record_cid, data, give_up_after=self.close_retry_s)
        journal.close_round(r, str(output), str(record_cid))
        journal.mark_published(r)
        await asyncio.to_thread(journal.flush)  # durable before announcing
        self.head = record_cid
        self._last = self._said = self._results(record, record_cid, plan.inputs)
        for topic, msg in self._said:
            await self._say(topic, msg)
        closed = [g.group for g in record.groups if g.failed is None]
        stats["groups"].update(completed=len(closed), failed=len(cfg.groups) - len(closed))
        stats["publish_s"] = round(time.perf_counter() - t0, 3)
        if book.started_at is not None:  # from the first word of a leaf to the end
            stats["started_s"] = round(self.clock() - book.started_at, 3)
        journal.set_stats(r, stats)
        await asyncio.to_thread(journal.flush)
        excluded = tuple((g.group, g.failed) for g in record.groups if g.failed is not None)
        peers = tuple(i.peer for i in plan.inputs)
        return RoundOutcome(r, "closed", output, record_cid, peers, excluded, None, stats)

    async def _fail(
        self, journal: Journal, r: int, reason: str, stats: dict[str, Any]
    ) -> RoundOutcome:
        journal.fail_round(r, reason)
        await asyncio.to_thread(journal.flush)
        self._last = self._said = self._failure(r, reason)
        for topic, status in self._said:
            await self._say(topic, status)
        return RoundOutcome(r, "failed", None, None, (), (), reason, stats)

    async def _said_again(self, row: RoundRow) -> None:
        """A restart: what the end of the last round (``row``) said, said again and repeated,
        so that peers and leaves waiting for it hear it (its record and the partial records
        read back for a closed round; never fatal)."""
        if row.state == "failed":
            self._last = self._failure(row.round, row.reason or "failed")
        else:
            try:
                cid = CID.parse(row.record or "")
                record = decode_tree_record(await self._block(cid), cid=cid)
                inputs = [
                    i
                    for g in record.groups
                    if g.record is not None
                    for i in decode_partial_record(await self._block(g.record), cid=g.record).inputs
                ]
            except (MessageError, IntegrityError, NodeError, TimeoutError, ValueError) as exc:
                log.warning("round %d: its result is not said again: %s", row.round, exc)
                return
            self._last = self._results(record, cid, sorted(inputs, key=lambda i: i.peer))
        self._said = list(self._last)
        for topic, msg in self._said:
            await self._say(topic, msg)

    async def _block(self, cid: CID) -> bytes:
        """A block from the node, within the resolve timeout."""
        return await asyncio.wait_for(self.node.get_block(cid), self.resolve_timeout_s)

    def _failure(self, r: int, reason: str) -> list[tuple[str, Status]]:
        """Round ``r`` failed: the root's status saying why, on the job's topic and each
        group's (its roster), where peers wait."""
        views = [self.config] + [self.config.group_view(g.name) for g in self.config.groups]
        return [
            (view.results_topic, dataclasses.replace(self._status(r, view), failed=shorten(reason)))
            for view in views
        ]

    # -- saying things ---------------------------------------------------------------------
    def _status(self, r: int, view: JobConfig | None = None) -> Status:
        """The root's status of round ``r`` on the job's topic (``view``: a group's, over
        its roster): it admits nothing itself (its bitmaps are empty); it says the run,
        which the leaves adopt."""
        empty = (view or self.config).roster.bitmap([])
        return Status(
            job=self.config.job,
            run=self.run_id,
            round=r,
            received=empty,
            verified=empty,
            refused=empty,
            reasons=(),
            sent_at=self._stamp(),
        )

    def _results(self, record: TreeRecord, record_cid: CID, inputs: Any) -> list[tuple[str, Any]]:
        """The round's result on the job's topic (every peer aggregated) and on each group's
        (its own peers, over its roster: what they check)."""
        aggregated = {i.peer for i in inputs}
        out: list[tuple[str, Any]] = []
        views = [self.config] + [self.config.group_view(g.name) for g in self.config.groups]
        for view in views:
            out.append(
                (
                    view.results_topic,
                    Result(
                        job=record.job,
                        run=record.run,
                        round=record.round,
                        cid=str(record.output),
                        record=str(record_cid),
                        method=record.method,
                        peers=view.roster.bitmap([p for p in view.peers if p in aggregated]),
                        sent_at=self._stamp(),
                    ),
                )
            )
        return out

    def _stamp(self) -> int:
        return int(self.clock() * 1000)

    async def _say(self, topic: str, msg: Any) -> None:
        """Sign (with a fresh stamp) and publish ``msg`` on ``topic``; never fatal."""
        try:
            data, block = encode_fitted(dataclasses.replace(msg, sent_at=self._stamp()), self.key)
            if block is not None:
                await self.node.put_block(block[1], block[0].codec)
                with contextlib.suppress(NodeError):
                    await self.node.pin_many([block[0]])
            await self.node.publish(topic, data)
        except NodeError as exc:
            log.warning("publishing on %s failed: %s", topic, exc)

    async def _beacon(self) -> None:
        """Repeat what the root last said (its open round's status, or the last result)."""
        while True:
            await asyncio.sleep(self.rebroadcast_s)
            for topic, msg in list(self._said):
                await self._say(topic, msg)
