"""The coordinator service: asyncio tasks that wait for I/O and apply what the state decides.

Every decision is ``state.CoordinatorState``'s: a task here hands it an event and applies
the ``Effects`` it returns. The tasks all live in one ``asyncio.TaskGroup`` (so every one
is awaited, cancelled or not): the reader (each announcement, never waiting, so a flood
of replays costs O(1) each); the journal writer (accepted announcements are committed in
batches, and only then acknowledged and fetched); the dispatcher and its fetch attempts
(``inputs.verify_input``), and the kernel's preparation; the status publisher (each
changed round at most every ``STATUS_EVERY_S``); the beacon (what peers may have missed,
re-signed, since pubsub drops messages and peers refuse stale ones); and the round loop,
which opens a round, starts each of its steps' close as soon as it is due, each on a task
of its own (a job without steps: its one step, the round), so steps due together store
and publish at once and a slow close holds up no other step; once every step is over and
every close ended, it ends the round (``closer``: ``closing.close_round``, and a stepped
round's model-level output and round/5 record).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from ..dag import CID
from ..errors import (
    CoordinatorError,
    NodeError,
    Reason,
    RefusedError,
)
from ..job import JobConfig
from ..messages import (
    SigningKey,
    encode_fitted,
)
from ..node import Node, follow
from ..store import GradientStore
from ._tasks import relay, under_way, until, unwrap
from .admission import Verdict
from .closing import DEFAULT_CLOSE_RETRY_S, prepare_aggregation
from .fetch_plan import DEFAULT_ATTEMPTS
from .held import HeldOutputs
from .inputs import ByteBudget, VerifiedInput, verify_input
from .journal import Journal
from .outcome import RoundOutcome, format_outcome
from .pinner import BatchPinner
from .progress import RoundProgress
from .rounds import RoundBook
from .spill import SpillDir, clear_at_start, spill_dir_for
from .split import SplitSteps, check_owner
from .state import CoordinatorState, Effects, FetchFailed, Key
from .steps import StepName, key_step

log = logging.getLogger("gradstore.coordinator")

#: A round's status goes out at most this often (changes in between are coalesced).
STATUS_EVERY_S: Final = 0.1
#: How many pinned lists blocks the coordinator remembers, not to pin a repeat again.
LISTS_PINNED_KEPT: Final = 1024


class Coordinator(SplitSteps):
    """Runs the rounds of one job over one node (its steps' too: ``closer``)."""

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
        spill: bool | SpillDir = True,
    ) -> None:
        check_owner(config, key.did)
        self.config = config
        self.key = key
        self.node = node
        self.state_dir = Path(state_dir)
        self.store = GradientStore(node, limits=config.limits)
        self.state = CoordinatorState(
            config,
            restart_grace_s=restart_grace_s,
            fetch_workers=fetch_concurrency,
            fetch_attempts=fetch_attempts,
            owner=key.did,
            remote_grace_s=close_retry_s,
        )
        self.resolve_timeout_s = resolve_timeout_s
        self.rebroadcast_s = rebroadcast_s
        self.linger_s = linger_s
        self.close_retry_s = close_retry_s
        self.on_round = on_round
        self.clock = clock
        self.outcomes: list[RoundOutcome] = []
        # the state's own counters, never rebound: refusals by reason, the recent ones, logs
        self.refusals, self.recent_refusals = self.state.refusals, self.state.recent_refusals
        self.refusal_log = self.state.refusal_log
        self._books = self.state.books  # the open round's and buffered ones (tests watch them)
        self._budget = ByteBudget(memory_budget_bytes)
        self._pinner = BatchPinner(node)  # verified inputs, pinned in batches
        self._keep = ByteBudget(keep_bytes)
        self._held = HeldOutputs(keep_bytes)  # closed steps' outputs, kept for the model's
        # verified inputs' bytes, read back from here at the close (None: from the node)
        self._spills: SpillDir | None = spill_dir_for(spill, self.state_dir / "spill")
        self._lists_pinned: set[CID] = set()  # lists blocks pinned (repeats share them)
        self._attempts: dict[Key, asyncio.Task[None]] = {}
        self._prepared: asyncio.Task[None] | None = None
        self._journal: Journal | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._news = asyncio.Event()  # anything that may change a round or the plan
        self._journal_wake = asyncio.Event()
        self._plan_wake = asyncio.Event()  # a fetch may start: new input or a free worker
        self._status_wake = asyncio.Event()
        self._remote_reads: set[tuple[int, str]] = set()  # other owners' records being read
        self._root_news = asyncio.Event()  # at another owner: the root ended a round

    # -- what the state knows, as the coordinator's ------------------------------------------
    @property
    def round(self) -> int:
        """The open round (between two rounds, the next to open)."""
        return self.state.round

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def head(self) -> CID | None:  # the last closed round's record
        return self.state.head

    def progress(self) -> RoundProgress | None:
        """The open round's counts and time left (None when no round is open)."""
        return None if self._journal is None else self.state.progress(self.clock())

    def stats(self) -> dict[str, Any]:
        """The open round's steps (total, completed, pending, failed), the bytes held for
        aggregation and the peers taking part (``CoordinatorState.stats``)."""
        return self.state.stats()

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
        if effects.unspill and self._spills is not None:
            self._spills.remove(effects.unspill)
        if effects.prepare is not None and self._tg is not None:  # once per run
            self._prepared = self._tg.create_task(
                prepare_aggregation(effects.prepare), name="kernel"
            )
        return effects

    # -- lifecycle -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> list[RoundOutcome]:
        """Run rounds until ``rounds.count`` are done (or ``stop`` is set); return their outcomes."""
        stop = stop or asyncio.Event()
        with Journal(self.state_dir / "journal.sqlite") as journal:
            self._journal = journal
            try:
                # a crash's spill files, or a past round's: never trusted
                await asyncio.to_thread(clear_at_start, self._spills, self.state_dir / "spill")
                self.state.run_id = await self._bind(journal, stop)
                if not self.state.run_id:
                    return self.outcomes  # stopped before the root was heard
                await self._recover()
                async with self.node.subscribe(self.config.gradients_topic) as sub:
                    await unwrap(self._serve(sub, stop))
            finally:
                self._journal = None
        return self.outcomes

    async def _serve(self, sub: Any, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            background = [
                tg.create_task(self._read(sub), name="coordinator-reader"),
                tg.create_task(self._remote(), name="coordinator-remote-steps"),
                tg.create_task(self._journal_writer(), name="coordinator-journal"),
                tg.create_task(self._dispatch(), name="coordinator-fetches"),
                tg.create_task(self._publisher(), name="coordinator-statuses"),
                tg.create_task(self._beacon(), name="coordinator-beacon"),
                tg.create_task(relay(stop, self._news), name="coordinator-stop"),
            ]
            try:
                await self._rounds(stop)
                await self._until_root(stop)
                if not stop.is_set() and self.linger_s > 0:
                    await until(stop, self.linger_s)  # let late peers see the last result
            finally:
                for task in (*background, *self._attempts.values()):
                    task.cancel()
                if self._prepared is not None:  # a thread: let it finish rather than leak it
                    await asyncio.gather(self._prepared, return_exceptions=True)
                self._tg = None

    # -- rounds ----------------------------------------------------------------------------
    async def _rounds(self, stop: asyncio.Event) -> None:
        count = self.config.rounds.count
        while (count == 0 or self.round < count) and not stop.is_set():
            row = self.journal.open_round(self.round, opened_at=self.clock())
            self._apply(self.state.opened(row, self.journal.inputs(row.round), self.clock())[1])
            # each step closes on its own task, as soon as it is due, while this loop goes on
            # starting the others' (their stores and publishes overlap; the state is one)
            closes: dict[StepName, asyncio.Task[RoundOutcome]] = {}
            while not self.state.round_done(row.round) or under_way(closes):
                if stop.is_set():
                    await asyncio.gather(*closes.values())  # the closes under way end first
                    if self.state.round_done(row.round):
                        break  # they ended it: end the round as a run would
                    return  # stopped: the round stays open in the journal
                self._news.clear()
                closing, wake = self.state.due(now := self.clock())
                started = [book for book in closing if book.step not in closes]
                for book in started:
                    closes[book.step] = self._close_task(book)
                silent, remote_wake = self.state.remote_due(now)  # other owners' steps
                for step, reason in silent:
                    self._apply(self.state.remote_failed(row.round, step, reason))
                if remote_wake is not None:
                    wake = remote_wake if wake is None else min(wake, remote_wake)
                if not started and not silent:
                    await until(self._news, None if wake is None else wake - now)
            steps = [closes[step].result() for step in self.state.steps if step in closes]
            outcome = await self._finish_round(row.round, steps)
            self.journal.set_stats(row.round, outcome.stats)
            await asyncio.to_thread(self.journal.flush)
            self.outcomes.append(outcome)
            log.info("%s", format_outcome(outcome))
            if self.on_round is not None:
                self.on_round(outcome)

    def _close_task(self, book: RoundBook) -> asyncio.Task[RoundOutcome]:
        """``_close_step(book)`` as a task of the service's group; the round loop hears
        when it ends."""

        async def close() -> RoundOutcome:
            try:
                return await self._close_step(book)
            finally:
                self._news.set()

        assert self._tg is not None
        name = f"coordinator-close-{book.round}" + ("" if book.step is None else f"-{book.step}")
        return self._tg.create_task(close(), name=name)

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
            await until(self._plan_wake, None if wake is None else max(0.0, wake - self.clock()))
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
                    step=order.step,
                    pinner=self._pinner,
                    spill=None
                    if self._spills is None
                    else self._spills.target(*key[:2], key_step(key)),
                    checked=lambda: self._apply(self.state.checked(key)),
                )
        except RefusedError as exc:
            got = FetchFailed(exc.reason)
        except (NodeError, TimeoutError) as exc:
            got = FetchFailed(str(exc) or f"no answer in {self.resolve_timeout_s:.0f} s", True)
        except Exception as exc:  # a bug must fail this input, not the round
            log.exception("round %d: verifying the input of %s crashed", key[0], key[1])
            got = FetchFailed(f"{Reason.INTERNAL} error: {type(exc).__name__}: {exc}")
        finally:
            self._attempts.pop(key, None)
            self._apply(self.state.fetched(key, got, time.perf_counter() - start, self.clock()))

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
                await self._pin_lists(block[0])
            await self.node.publish(self.config.results_topic, data)
        except NodeError as exc:  # peers re-announce and we re-broadcast: never fatal
            log.warning("publishing on %s failed: %s", self.config.results_topic, exc)

    async def _pin_lists(self, cid: CID) -> None:
        """Pin a lists block once, as the round's other blocks are (through the node, so a
        cluster keeps it too, submitted without waiting: a status is never held up)."""
        if cid in self._lists_pinned:
            return
        try:
            await self.node.pin_many([cid])
        except NodeError as exc:  # the message still goes out; a later status pins again
            log.warning("pinning the lists block %s failed: %s", cid, exc)
            return
        if len(self._lists_pinned) >= LISTS_PINNED_KEPT:
            self._lists_pinned.clear()
        self._lists_pinned.add(cid)

    async def _beacon(self) -> None:
        """Repeat what peers may have missed, re-signed with a fresh time."""
        while True:
            self._apply(self.state.beacon())
            for msg in self.state.repeats(self._stamp()):
                await self._publish(msg)
            self.state.log_refusals(self.clock())  # a flood's last counts, once it stopped
            await asyncio.sleep(self.rebroadcast_s)
