"""The coordinator service: the asyncio tasks that apply what ``state.CoordinatorState`` decides.

Every decision (admission, the replay filter, which input to fetch and when a failure is
final, when a round closes and whom it aggregates, what peers hear and what the beacon
repeats, recovery) is the state's: a task here waits for I/O, hands the event to the
state, and applies the ``Effects`` it returns. The tasks, all in one ``asyncio.TaskGroup``
(so every one is awaited, cancelled or not):

- the reader hands each announcement to the state; it never waits on the node, the
  journal or a publish, so a flood of replays costs O(1) each;
- the journal writer commits accepted announcements in batches, and only then are they
  acknowledged and fetched;
- the dispatcher starts fetch attempts as the state's ``FetchPlan`` allows, each a task
  of its own (``inputs.verify_input``), and the kernel is prepared in one as well;
- the publisher sends each changed round's status at most every ``STATUS_EVERY_S``;
- the beacon repeats what the state says peers may have missed, re-signed with a fresh
  time, because pubsub may drop messages and peers refuse stale ones;
- the round loop opens a round, waits until it should close, and closes it
  (``closing.close_round``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from ..aggregate import prepare
from ..dag import CID
from ..errors import AggregationError, CoordinatorError, NodeError
from ..format import Gradient
from ..job import JobConfig
from ..messages import SigningKey, announcement_signature, decode_record, encode_fitted
from ..messages.refusal_log import RefusalLog
from ..node import Node, follow
from ..store import GradientStore
from .admission import Verdict
from .closing import DEFAULT_CLOSE_RETRY_S, Closed, close_round, with_retries
from .fetch_plan import DEFAULT_ATTEMPTS
from .inputs import ByteBudget, InputRefused, VerifiedInput, verify_input
from .journal import Journal
from .outcome import RoundOutcome, format_outcome
from .progress import RoundProgress
from .rounds import RoundBook
from .state import CoordinatorState, Effects, FetchFailed, Judged, Key

log = logging.getLogger("gradstore.coordinator")

#: A round's status goes out at most this often (changes in between are coalesced).
STATUS_EVERY_S: Final = 0.1


class Coordinator:
    """Runs the rounds of one job over one node."""

    def __init__(
        self,
        config: JobConfig,
        key: SigningKey,
        node: Node,
        state_dir: str | Path,
        *,
        fetch_concurrency: int = 16,
        fetch_attempts: int = DEFAULT_ATTEMPTS,
        resolve_timeout_s: float = 10.0,
        restart_grace_s: float | None = None,
        memory_budget_bytes: int = 256 << 20,
        keep_bytes: int = 128 << 20,
        rebroadcast_s: float = 2.0,
        linger_s: float = 3.0,
        close_retry_s: float = DEFAULT_CLOSE_RETRY_S,
        on_round: Callable[[RoundOutcome], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if key.did != config.coordinator:
            raise CoordinatorError(
                f"the key's id {key.did} is not the job's coordinator {config.coordinator}"
            )
        self.config = config
        self.key = key
        self.node = node
        self.state_dir = Path(state_dir)
        self.store = GradientStore(node, limits=config.limits)
        grace = min(config.rounds.deadline_s, 30.0) if restart_grace_s is None else restart_grace_s
        self.state = CoordinatorState(
            config,
            restart_grace_s=grace,
            fetch_workers=fetch_concurrency,
            fetch_attempts=fetch_attempts,
        )
        self.resolve_timeout_s = resolve_timeout_s
        self.rebroadcast_s = rebroadcast_s
        self.linger_s = linger_s
        self.close_retry_s = close_retry_s
        self.on_round = on_round
        self.clock = clock
        self.outcomes: list[RoundOutcome] = []
        self._budget = ByteBudget(memory_budget_bytes)
        self._keep = ByteBudget(keep_bytes)
        self._attempts: dict[Key, asyncio.Task[None]] = {}
        self._prepared: asyncio.Task[None] | None = None
        self._journal: Journal | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._news = asyncio.Event()  # anything that may change a round or the plan
        self._journal_wake = asyncio.Event()
        self._plan_wake = asyncio.Event()  # a fetch may start: new input or a free worker
        self._status_wake = asyncio.Event()

    # -- what the state knows, as the coordinator's ------------------------------------------
    @property
    def round(self) -> int:
        """The open round (between two rounds, the next to open)."""
        return self.state.round

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def head(self) -> CID | None:
        """The last closed round's record."""
        return self.state.head

    @property
    def refusals(self) -> Counter[str]:
        """Refused announcements by reason (exact replays count as ``duplicate``)."""
        return self.state.refusals

    @property
    def recent_refusals(self) -> deque[tuple[str, str]]:
        return self.state.recent_refusals

    @property
    def refusal_log(self) -> RefusalLog:
        return self.state.refusal_log

    @property
    def _books(self) -> dict[int, RoundBook]:  # tests watch a round's book
        return self.state.books

    def progress(self) -> RoundProgress | None:
        """The open round's counts and time left (None when no round is open)."""
        return None if self._journal is None else self.state.progress(self.clock())

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            raise CoordinatorError("coordinator is not running")
        return self._journal

    def _apply(self, effects: Effects) -> Effects:
        """Queue the journal rows and wake the tasks an event concerns."""
        for write in effects.writes:
            write.to(self.journal)
        for wake, due in (
            (self._journal_wake, effects.writes),
            (self._status_wake, effects.statuses),
            (self._news, effects.news),
            (self._plan_wake, effects.fetch),
        ):
            if due:
                wake.set()
        if effects.give_back:
            self._keep.give_back(effects.give_back)
        if effects.prepare is not None and self._tg is not None:
            self._prepared = self._tg.create_task(_prepare(effects.prepare), name="kernel")
        return effects

    # -- lifecycle -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> list[RoundOutcome]:
        """Run rounds until ``rounds.count`` are done (or ``stop`` is set); return their outcomes."""
        stop = stop or asyncio.Event()
        with Journal(self.state_dir / "journal.sqlite") as journal:
            self._journal = journal
            try:
                self.state.run_id = journal.bind(self.config.job, self.config.coordinator)
                await self._recover()
                async with self.node.subscribe(self.config.gradients_topic) as sub:
                    await _unwrap(self._serve(sub, stop))
            finally:
                self._journal = None
        return self.outcomes

    async def _serve(self, sub: Any, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            background = [
                tg.create_task(self._read(sub), name="coordinator-reader"),
                tg.create_task(self._journal_writer(), name="coordinator-journal"),
                tg.create_task(self._dispatch(), name="coordinator-fetches"),
                tg.create_task(self._publisher(), name="coordinator-statuses"),
                tg.create_task(self._beacon(), name="coordinator-beacon"),
                tg.create_task(_relay(stop, self._news), name="coordinator-stop"),
            ]
            try:
                await self._rounds(stop)
                if not stop.is_set() and self.linger_s > 0:
                    await _until(stop, self.linger_s)  # let late peers see the last result
            finally:
                for task in (*background, *self._attempts.values()):
                    task.cancel()
                if self._prepared is not None:  # a thread: let it finish rather than leak it
                    await asyncio.gather(self._prepared, return_exceptions=True)
                self._tg = None

    async def _recover(self) -> None:
        """Resume from the journal: head record, current round, unpublished results."""
        journal = self.journal
        rows = journal.rounds()
        for r, cid, publish in self.state.recovered(rows, journal.get_meta("schema")):
            read = functools.partial(self.node.get_block, cid)
            data = await with_retries(f"reading round record {cid}", read)
            self.state.announce_result(decode_record(data, cid=cid), cid)
            if publish:
                await self._publish(self.state.result(self._stamp()))
                journal.mark_published(r)
        self.state.remember(journal.inputs_from(self.state.round))
        journal.flush()
        if rows:
            log.info(
                "resuming job %s run %s at round %d (head record %s)",
                self.config.job,
                self.run_id,
                self.round,
                self.head,
            )

    # -- rounds ----------------------------------------------------------------------------
    async def _rounds(self, stop: asyncio.Event) -> None:
        count = self.config.rounds.count
        while (count == 0 or self.round < count) and not stop.is_set():
            row = self.journal.open_round(self.round, opened_at=self.clock())
            book, effects = self.state.opened(row, self.journal.inputs(row.round), self.clock())
            self._apply(effects)
            while True:
                if stop.is_set():
                    return  # stopped: the round stays open in the journal
                self._news.clear()
                check = self.state.should_close(book, now := self.clock())
                if check.close:
                    break
                await _until(self._news, None if check.wake_at is None else check.wake_at - now)
            outcome = await self._close(book)
            self.journal.set_stats(book.round, outcome.stats)
            await asyncio.to_thread(self.journal.flush)
            self.outcomes.append(outcome)
            log.info("%s", format_outcome(outcome))
            if self.on_round is not None:
                self.on_round(outcome)

    async def _close(self, book: RoundBook) -> RoundOutcome:
        t_close = time.perf_counter()
        r = book.round
        for key in [k for k in self._attempts if k[0] == r]:
            self._attempts[key].cancel()
        judged = self.state.judge(book, self.clock())
        self._apply(judged.effects)
        outcome: RoundOutcome
        if judged.failure is not None:
            outcome = await self._fail(judged, judged.failure)
        else:
            try:
                closed = await close_round(
                    self.config,
                    self.key,
                    self.node,
                    self.store,
                    run=self.run_id,
                    round_=r,
                    inputs=judged.inputs,
                    excluded=judged.excluded_cids,
                    prev=self.head,
                    announcements=self._announcements(r, judged.verified),
                    give_up_after=self.close_retry_s,
                )
            except AggregationError as exc:
                outcome = await self._fail(judged, f"aggregation refused: {exc}")
            else:
                outcome = await self._closed(judged, closed, t_close)
        effects = self._apply(self.state.forget(r, keep_pins=outcome.status == "closed"))
        for cid in effects.unpin:
            with contextlib.suppress(NodeError):
                await self.node.unpin(cid)
        # from the first accepted announcement (when the round's clock started) to the end
        outcome.stats["started_s"] = round(self.clock() - (book.started_at or book.opened_at), 3)
        return outcome

    def _announcements(self, round_: int, peers: Sequence[str]) -> dict[str, tuple[int, bytes]]:
        """Each peer's signed announcement of ``round_`` as the journal keeps it (sent_at, sig)."""
        out = {}
        for peer in peers:
            data = self.journal.message(round_, peer)
            if data is not None:
                ann, sig = announcement_signature(data)
                out[peer] = (ann.sent_at, sig)
        return out

    async def _closed(self, judged: Judged, closed: Closed, t_close: float) -> RoundOutcome:
        r = judged.round
        self._apply(self.state.close_succeeded(r, closed))
        await asyncio.to_thread(self.journal.flush)  # durable before announcing
        await self._publish(self.state.status(r, self._stamp()))  # its last word on each peer
        self.state.announce_result(closed.record, closed.record_cid)
        await self._publish(self.state.result(self._stamp()))
        self.journal.mark_published(r)
        stats = judged.stats
        stats.update(closed.stats)
        stats["publish_s"] = stats.pop("store_s", 0.0)
        stats["close_s"] = round(time.perf_counter() - t_close, 3)
        peers = tuple(i.peer for i in closed.record.inputs)
        return RoundOutcome(
            r, "closed", closed.output, closed.record_cid, peers, judged.excluded, None, stats
        )

    async def _fail(self, judged: Judged, reason: str) -> RoundOutcome:
        r = judged.round
        self._apply(self.state.close_failed(r, reason))
        await asyncio.to_thread(self.journal.flush)
        self.state.announce_failure(r, reason)
        await self._publish(self.state.status(r, self._stamp(), failed=reason))
        return RoundOutcome(r, "failed", None, None, (), judged.excluded, reason, judged.stats)

    # -- announcements -----------------------------------------------------------------------
    async def _read(self, sub: Any) -> None:
        async for msg in follow(self.node, sub):
            try:
                self.on_message(msg.data)
            except Exception:  # one bad message must never stop the service
                log.exception("error handling a message from %s", getattr(msg, "from_peer", "?"))

    def on_message(self, data: bytes) -> Verdict:
        """Admit one raw announcement (synchronous: no I/O, never waits)."""
        verdict, effects = self.state.admit(data, self.clock())
        self._apply(effects)
        return verdict

    async def _journal_writer(self) -> None:
        """Commit queued journal writes in batches; then act on the accepted announcements."""
        while True:
            await self._journal_wake.wait()
            self._journal_wake.clear()
            accepted = self.state.take_accepted()
            await asyncio.to_thread(self.journal.flush)
            self._apply(self.state.accepted(accepted, self.clock()))

    # -- fetch and verify ---------------------------------------------------------------------
    async def _dispatch(self) -> None:
        """Start fetch attempts as the plan allows; wake on news or at the next retry time."""
        while True:
            key, wake = self.state.plan.next(self.clock())
            if key is not None:
                assert self._tg is not None
                self._attempts[key] = self._tg.create_task(self._attempt(key))
                continue
            await _until(self._plan_wake, None if wake is None else max(0.0, wake - self.clock()))
            self._plan_wake.clear()

    async def _attempt(self, key: Key) -> None:
        """One bounded attempt at ``key``'s input; whatever happens, the state hears of it."""
        got: VerifiedInput | FetchFailed | None = None  # None: cancelled, or nothing to do
        start = time.perf_counter()
        try:
            order = self.state.order(key)
            if order is not None:
                got = await verify_input(
                    self.node,
                    self.store,
                    key[1],
                    order.cid,
                    order.claim.num_samples,
                    expected=order.schema,
                    resolve_timeout_s=self.resolve_timeout_s,
                    budget=self._budget,
                    keep=self._keep,
                    clip=order.clip,
                    claim=order.claim,
                )
        except InputRefused as exc:
            got = FetchFailed(exc.reason)
        except (NodeError, TimeoutError) as exc:
            got = FetchFailed(str(exc) or f"no answer in {self.resolve_timeout_s:.0f} s", True)
        except Exception as exc:  # a bug must fail this input, not the round
            log.exception("round %d: verifying the input of %s crashed", key[0], key[1])
            got = FetchFailed(f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self._attempts.pop(key, None)
            seconds = time.perf_counter() - start
            self._apply(self.state.fetched(key, got, seconds, self.clock()))

    # -- publishing ---------------------------------------------------------------------------
    async def _publisher(self) -> None:
        while True:
            await self._status_wake.wait()
            self._status_wake.clear()
            for status in self.state.due_statuses(self._stamp()):
                await self._publish(status)
            await asyncio.sleep(STATUS_EVERY_S)

    def _stamp(self) -> int:
        return int(self.clock() * 1000)

    async def _publish(self, msg: Any) -> None:
        """Sign and publish ``msg`` on the results topic (None: nothing to say)."""
        if msg is None:
            return
        try:
            data, block = encode_fitted(msg, self.key)
            if block is not None:
                await self.node.put_block(block[1], block[0].codec)
            await self.node.publish(self.config.results_topic, data)
        except NodeError as exc:  # peers re-announce and we re-broadcast: never fatal
            log.warning("publishing on %s failed: %s", self.config.results_topic, exc)

    async def _beacon(self) -> None:
        """Repeat what peers may have missed, re-signed with a fresh time."""
        while True:
            self._apply(self.state.beacon())
            await self._publish(self.state.result(self._stamp()))
            await self._publish(self.state.failure(self._stamp()))
            self.state.log_refusals(self.clock())  # a flood's last counts, once it stopped
            await asyncio.sleep(self.rebroadcast_s)


async def _until(event: asyncio.Event, timeout: float | None) -> None:
    """Wait until ``event`` is set or ``timeout`` seconds pass (no task of its own)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


async def _relay(stop: asyncio.Event, news: asyncio.Event) -> None:
    """Wake the round loop when ``stop`` is set (it waits on ``news`` alone)."""
    await stop.wait()
    news.set()


async def _unwrap(coro: Any) -> None:
    """Await ``coro``; a TaskGroup's single error is raised as itself, not as a group."""
    try:
        await coro
    except BaseExceptionGroup as group:
        errors = [e for e in group.exceptions if not isinstance(e, asyncio.CancelledError)]
        if len(errors) == 1:
            raise errors[0] from None
        raise


async def _prepare(gradient: Gradient) -> None:
    """Get the aggregators' compiled kernel ready for inputs like ``gradient``, off the loop."""
    try:
        ready = await asyncio.to_thread(prepare, gradient.tensors)
    except Exception:  # the aggregate stage would meet the same problem and report it
        log.exception("preparing the aggregation kernel failed")
    else:
        log.debug("aggregation kernel: %s", "numba" if ready else "NumPy")
