"""The coordinator service: a thin asyncio shell around the pure round rules.

Tasks, all in one ``asyncio.TaskGroup`` (so every one is awaited, cancelled or not):

- the reader decodes each announcement and asks ``admission.admit`` what to do; it never
  waits on the node, the journal or a publish, so a flood of replays costs O(1) each
  (a replayed byte string is dropped before its signature is even checked);
- the journal writer commits accepted announcements in batches, and only then are they
  acknowledged and fetched;
- the dispatcher starts fetch attempts as ``FetchPlan`` allows (``inputs.verify_input``);
- the publisher sends each changed round's status at most every ``STATUS_EVERY_S``;
- the beacon repeats the open round's status and the last result or failure, re-signed
  with a fresh time, because pubsub may drop messages and peers refuse stale ones;
- the round loop opens a round, waits for ``rounds.should_close``, judges it and closes it
  (``closing.close_round``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ..aggregate import prepare
from ..dag import CID
from ..errors import AggregationError, CoordinatorError, MessageError, NodeError
from ..format import Gradient
from ..job import JobConfig
from ..messages import (
    MAX_MESSAGE_BYTES,
    Announce,
    RoundRecord,
    SigningKey,
    announcement_signature,
    decode_record,
    encode_fitted,
    verify_message,
)
from ..messages.refusal_log import RefusalLog
from ..node import Node, follow
from ..store import GradientStore
from .admission import AdmissionState, Verdict, admit
from .binding import Claim
from .closing import DEFAULT_CLOSE_RETRY_S, close_round, with_retries
from .fetch_plan import DEFAULT_ATTEMPTS, FetchPlan
from .inputs import ByteBudget, InputRefused, VerifiedInput, verify_input
from .journal import Journal
from .rounds import (
    PeerState,
    RoundBook,
    Schema,
    cut_off,
    drop_duplicate_cids,
    judge,
    keep_majority_schema,
    schema_from_json,
    should_close,
)
from .statuses import result_of, status_of

log = logging.getLogger("gradstore.coordinator")

#: A round's status goes out at most this often (changes in between are coalesced).
STATUS_EVERY_S: Final = 0.1

#: Message digests remembered to drop exact replays before any work.
SEEN_MESSAGES: Final = 1 << 16

#: Refusals kept in ``recent_refusals`` (all are counted in ``refusals``).
RECENT_REFUSALS: Final = 256


@dataclass(frozen=True)
class RoundOutcome:
    """How one round ended: closed with an aggregate and record, or failed with a reason."""

    round: int
    status: str  # "closed" | "failed"
    output: CID | None
    record: CID | None
    peers: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...]
    reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Progress:
    """Where the open round stands: for "waiting for peers" lines (``Coordinator.progress``)."""

    round: int
    expected: int
    received: int
    verified: int
    failed: int
    quorum: int
    deadline_in: float | None  # seconds; None until the first announcement starts the clock

    def line(self) -> str:
        """``round 0: waiting for peers (1/3 verified, 2 received, deadline in 41 s)``."""
        clock = (
            "the deadline starts at the first announcement"
            if self.deadline_in is None
            else f"deadline in {max(0.0, self.deadline_in):.0f} s"
        )
        failed = f", {self.failed} refused" if self.failed else ""
        return (
            f"round {self.round}: waiting for peers ({self.verified}/{self.expected} verified, "
            f"{self.received} received{failed}, quorum {self.quorum}, {clock})"
        )


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
        self.fetch_concurrency = fetch_concurrency
        self.fetch_attempts = fetch_attempts
        self.resolve_timeout_s = resolve_timeout_s
        self.restart_grace_s = (
            min(config.rounds.deadline_s, 30.0) if restart_grace_s is None else restart_grace_s
        )
        self.rebroadcast_s = rebroadcast_s
        self.linger_s = linger_s
        self.close_retry_s = close_retry_s
        self.on_round = on_round
        self.clock = clock
        self.outcomes: list[RoundOutcome] = []
        self.refusals: Counter[str] = Counter()  # reason -> how many, for logs and tests
        self.recent_refusals: deque[tuple[str, str]] = deque(maxlen=RECENT_REFUSALS)
        self.refusal_log = RefusalLog()  # which refusals get a line of their own
        self.round = 0
        self.head: CID | None = None
        self.run_id = ""
        self._budget = ByteBudget(memory_budget_bytes)
        self._keep = ByteBudget(keep_bytes)
        self._books: dict[int, RoundBook] = {}  # the open round and buffered ones
        self._past: OrderedDict[int, RoundBook] = OrderedDict()  # refusals for late announcers
        self._announced: dict[tuple[int, str], str] = {}
        self._verified: dict[tuple[int, str], VerifiedInput] = {}
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._accepted: list[tuple[Announce, float]] = []  # queued in the journal, not committed
        self._attempts: dict[tuple[int, str], asyncio.Task[None]] = {}
        self._plan = FetchPlan(fetch_concurrency, attempts=fetch_attempts)
        self._dirty: set[int] = set()
        self._last_result: RoundRecord | None = None
        self._last_result_cid = ""
        self._last_failure: tuple[int, str] | None = None
        self._journal: Journal | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._news = asyncio.Event()  # anything that may change a round or the plan
        self._journal_wake = asyncio.Event()
        self._plan_wake = asyncio.Event()  # a fetch may start: new input or a free worker
        self._status_wake = asyncio.Event()
        self._prepared: asyncio.Task[None] | None = None
        self._bytes_fetched = 0
        self._fetch_seconds = 0.0

    def progress(self) -> Progress | None:
        """The open round's counts and time left (None when no round is open)."""
        book = self._books.get(self.round)
        if book is None or self._journal is None:
            return None
        counts = book.counts()
        deadline = book.deadline(self.config.rounds.deadline_s)
        return Progress(
            round=book.round,
            expected=counts["expected"],
            received=counts["received"],
            verified=counts["verified"],
            failed=counts["failed"],
            quorum=self.config.rounds.quorum,
            deadline_in=None if deadline is None else deadline - self.clock(),
        )

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            raise CoordinatorError("coordinator is not running")
        return self._journal

    # -- lifecycle -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> list[RoundOutcome]:
        """Run rounds until ``rounds.count`` are done (or ``stop`` is set); return their outcomes."""
        stop = stop or asyncio.Event()
        with Journal(self.state_dir / "journal.sqlite") as journal:
            self._journal = journal
            try:
                self.run_id = journal.bind(self.config.job, self.config.coordinator)
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
            ]
            try:
                await self._rounds(stop)
                if not stop.is_set() and self.linger_s > 0:
                    await _wait(stop, self.linger_s)  # let late peers see the last result
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
        closed = [row for row in rows if row.state == "closed" and row.record]
        for row in closed:
            self.head = CID.parse(row.record or "")
            if not row.published or row is closed[-1]:  # the last one is re-broadcast too
                head = self.head

                async def read(cid: CID = head) -> bytes:
                    return await self.node.get_block(cid)

                data = await with_retries(f"reading round record {head}", read)
                record = decode_record(data, cid=head)
                self._last_result, self._last_result_cid = record, str(head)
                if not row.published:
                    await self._publish_result()
                    journal.mark_published(row.round)
        failed = [r for r in rows if r.state == "failed"]
        if failed:  # late peers of the last failed round still learn why
            self._last_failure = (failed[-1].round, failed[-1].reason or "failed")
        open_rows = [r for r in rows if r.state == "open"]
        if open_rows:
            self.round = open_rows[0].round
        elif rows:
            self.round = rows[-1].round + 1
        for inp in journal.inputs_from(self.round):
            self._announced[inp.round, inp.peer] = inp.cid
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
            book = self._open(self.round)
            if not await self._wait_for_close(book, stop):
                return  # stopped: the round stays open in the journal
            outcome = await self._close(book)
            self.journal.set_stats(book.round, outcome.stats)
            await asyncio.to_thread(self.journal.flush)
            self.outcomes.append(outcome)
            log.info("%s", format_outcome(outcome))
            if self.on_round is not None:
                self.on_round(outcome)
            self.round += 1

    def _book(self, round_: int) -> RoundBook:
        book = self._books.get(round_)
        if book is None:
            book = self._books[round_] = RoundBook(round_, self.config.peers, self.clock())
        return book

    def _open(self, round_: int) -> RoundBook:
        """Open ``round_``: its book from the journal (inputs accepted before, or before a
        restart, are fetched again), then announcements flow into it."""
        row = self.journal.open_round(round_, opened_at=self.clock())
        book = self._book(round_)
        book.opened_at = row.opened_at
        self._bytes_fetched, self._fetch_seconds = 0, 0.0
        for inp in self.journal.inputs(round_):  # accepted before a restart
            if inp.peer not in book.slots or book.slots[inp.peer].state != PeerState.PENDING:
                continue
            book.accept(inp.peer, inp.cid, inp.num_samples, inp.accepted_at)
            if inp.state == PeerState.FAILED:
                book.fail(inp.peer, inp.reason or "failed")
        if book.started_at is not None:  # buffered while the previous round was open
            book.started_at = max(book.started_at, book.opened_at)
        again = book.in_state(PeerState.RECEIVED)
        for peer in again:
            self._plan.add((round_, peer))
        deadline = book.deadline(self.config.rounds.deadline_s)
        if again and deadline is not None and deadline <= self.clock():
            # restarted after the deadline: the journaled inputs get a grace period to be
            # resolved again before the round is judged
            book.grace_until = self.clock() + self.restart_grace_s
        self._mark(round_)
        self._news.set()
        self._plan_wake.set()
        log.info(
            "round %d open: %d/%d peers already announced",
            round_,
            book.counts()["received"],
            len(book.slots),
        )
        return book

    async def _wait_for_close(self, book: RoundBook, stop: asyncio.Event) -> bool:
        deadline_s = self.config.rounds.deadline_s
        while not stop.is_set():
            self._news.clear()
            now = self.clock()
            check = should_close(book, deadline_s, now)
            if check.close:
                return True
            timeout = None if check.wake_at is None else max(0.0, check.wake_at - now)
            await _first(self._news, stop, timeout)
        return False

    async def _close(self, book: RoundBook) -> RoundOutcome:
        t_close = time.perf_counter()
        r = book.round
        for key in [k for k in self._attempts if k[0] == r]:
            self._attempts[key].cancel()
        for peer in cut_off(book):
            self.journal.set_input_state(r, peer, PeerState.FAILED, book.slots[peer].reason)
        self._plan.drop_round(r)
        for peer in drop_duplicate_cids(book):
            self.journal.set_input_state(r, peer, PeerState.FAILED, book.slots[peer].reason)
        if self._known_schema() is None:
            for peer in keep_majority_schema(book):
                self.journal.set_input_state(r, peer, PeerState.FAILED, book.slots[peer].reason)
        verdict = judge(book, self.config.rounds.quorum)
        stats: dict[str, Any] = {
            **book.counts(),
            "bytes_fetched": self._bytes_fetched,
            "resolve_s": round(self._fetch_seconds, 3),
            "open_s": round(self.clock() - book.opened_at, 3),
        }
        inputs = [self._verified[r, p] for p in verdict.verified]
        outcome: RoundOutcome
        if verdict.failure is not None:
            outcome = await self._fail(book, verdict.failure, verdict.excluded, stats)
        else:
            excluded = [(p, why, book.slots[p].cid) for p, why in verdict.excluded]
            try:
                closed = await close_round(
                    self.config,
                    self.key,
                    self.node,
                    self.store,
                    run=self.run_id,
                    round_=r,
                    inputs=inputs,
                    excluded=excluded,
                    prev=self.head,
                    announcements=self._announcements(r, verdict.verified),
                    give_up_after=self.close_retry_s,
                )
            except AggregationError as exc:
                outcome = await self._fail(
                    book, f"aggregation refused: {exc}", verdict.excluded, stats
                )
            else:
                outcome = await self._closed(book, closed, verdict.excluded, stats, t_close)
        await self._forget(book, keep_pins=outcome.status == "closed")
        # from the first accepted announcement (when the round's clock started) to the end
        stats["started_s"] = round(self.clock() - (book.started_at or book.opened_at), 3)
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

    async def _closed(
        self,
        book: RoundBook,
        closed: Any,
        excluded: tuple[tuple[str, str], ...],
        stats: dict[str, Any],
        t_close: float,
    ) -> RoundOutcome:
        r = book.round
        journal = self.journal
        verified = [i.peer for i in closed.record.inputs]
        for peer in verified:
            book.slots[peer].state = PeerState.AGGREGATED
            journal.set_input_state(r, peer, PeerState.AGGREGATED)
        if journal.get_meta("schema") is None and self.config.schema is None:
            schema = book.slots[verified[0]].schema
            assert schema is not None
            journal.set_meta("schema", [[n, d, list(s)] for n, d, s in schema])
        journal.close_round(r, str(closed.output), str(closed.record_cid))
        await asyncio.to_thread(journal.flush)  # durable before announcing
        await self._publish_status(book)  # its last word on each peer, before the result
        self.head = closed.record_cid
        self._last_result, self._last_result_cid = closed.record, str(closed.record_cid)
        await self._publish_result()
        journal.mark_published(r)
        stats.update(closed.stats)
        stats["publish_s"] = stats.pop("store_s", 0.0)
        stats["close_s"] = round(time.perf_counter() - t_close, 3)
        return RoundOutcome(
            r, "closed", closed.output, closed.record_cid, tuple(verified), excluded, None, stats
        )

    async def _fail(
        self,
        book: RoundBook,
        reason: str,
        excluded: tuple[tuple[str, str], ...],
        stats: dict[str, Any],
    ) -> RoundOutcome:
        self.journal.fail_round(book.round, reason)
        await asyncio.to_thread(self.journal.flush)
        self._last_failure = (book.round, reason)
        await self._publish_status(book, failed=reason)
        return RoundOutcome(book.round, "failed", None, None, (), excluded, reason, stats)

    async def _forget(self, book: RoundBook, *, keep_pins: bool) -> None:
        """Drop a closed round's inputs from memory (and their pins, if it was not aggregated)."""
        r = book.round
        items = [self._verified.pop(k) for k in [k for k in self._verified if k[0] == r]]
        # one CID may be two inputs' (duplicate-cid): it stays pinned if either was aggregated
        kept = {
            i.cid.to_v1()
            for i in items
            if keep_pins and book.slots[i.peer].state == PeerState.AGGREGATED
        }
        unpinned: set[CID] = set()
        for item in items:
            if item.gradient is not None:
                self._keep.give_back(item.nbytes)
            cid = item.cid.to_v1()
            if cid not in kept and cid not in unpinned:
                unpinned.add(cid)
                with contextlib.suppress(NodeError):
                    await self.node.unpin(item.cid)
        for key in [k for k in self._announced if k[0] <= r]:
            del self._announced[key]
        self._books.pop(r, None)
        self._past[r] = book
        while len(self._past) > 4:
            self._past.popitem(last=False)

    def _known_schema(self) -> Schema | None:
        if self.config.schema is not None:
            return tuple((t.name, t.dtype, t.shape) for t in self.config.schema)
        learned = self.journal.get_meta("schema")
        return None if learned is None else schema_from_json(learned)

    # -- announcements -----------------------------------------------------------------------
    async def _read(self, sub: Any) -> None:
        async for msg in follow(self.node, sub):
            try:
                self.on_message(msg.data)
            except Exception:  # one bad message must never stop the service
                log.exception("error handling a message from %s", getattr(msg, "from_peer", "?"))

    def on_message(self, data: bytes) -> Verdict:
        """Admit one raw announcement (synchronous: no I/O, never waits)."""
        if len(data) <= MAX_MESSAGE_BYTES:
            digest = hashlib.blake2b(data, digest_size=16).digest()
            if digest in self._seen:
                self.refusals["duplicate"] += 1
                return Verdict.DUPLICATE
            self._seen[digest] = None
            if len(self._seen) > SEEN_MESSAGES:
                self._seen.popitem(last=False)
        cfg = self.config
        try:
            ann = verify_message(data, job=cfg.job, coordinator=cfg.coordinator, peers=cfg.roster)
        except MessageError as exc:  # before its signature proved a sender: no sender
            return self._refused(exc.reason, str(exc).removeprefix(f"{exc.reason}: "))
        if not isinstance(ann, Announce):
            return self._refused("unexpected-type", f"{type(ann).__name__} on the gradients topic")
        state = AdmissionState(
            run=self.run_id,
            open_round=self.round,
            max_ahead=cfg.rounds.max_ahead,
            max_skew_ms=int(cfg.messages.max_clock_skew_s * 1000),
            announced=self._announced,
        )
        decision = admit(ann, state, int(self.clock() * 1000))
        if decision.verdict is Verdict.DUPLICATE:
            self.refusals["duplicate"] += 1
            return decision.verdict
        if decision.verdict is Verdict.REFUSE:
            if decision.tell:
                book = self._books.get(ann.round) or self._past.get(ann.round)
                if book is None:  # a round long over: a small book just to say so
                    book = self._past[ann.round] = RoundBook(ann.round, (), self.clock())
                    while len(self._past) > 8:
                        self._past.popitem(last=False)
                if book.refuse(ann.peer, decision.text):
                    self._mark(ann.round)
            return self._refused(decision.reason, f"{ann.peer}: {decision.text}", ann.peer)
        self._announced[ann.round, ann.peer] = ann.cid
        self.journal.accept(ann.round, ann.peer, ann.cid, ann.num_samples, data)
        self._accepted.append((ann, self.clock()))
        self._journal_wake.set()
        return Verdict.ACCEPT

    def _refused(self, reason: str, detail: str, sender: str | None = None) -> Verdict:
        """Count a refusal; log it in full only if ``refusal_log`` says so (``sender``: the
        peer its signature proved, None for unauthenticated junk)."""
        self.refusals[reason] += 1
        self.recent_refusals.append((reason, detail))
        now = self.clock()
        if self.refusal_log.refused(reason, sender, now):
            log.warning(
                "refused announcement: %s: %s (repeats are summed up every %.0f s)",
                reason,
                detail,
                self.refusal_log.every_s,
            )
        self._log_refusals(now)
        return Verdict.REFUSE

    def _log_refusals(self, now: float) -> None:
        """Log the summary of refusals not logged one by one, when one is due."""
        line = self.refusal_log.summary(now)
        if line is not None:
            log.warning("%s", line)

    async def _journal_writer(self) -> None:
        """Commit queued journal writes in batches; then act on the accepted announcements."""
        while True:
            await self._journal_wake.wait()
            self._journal_wake.clear()
            accepted, self._accepted = self._accepted, []
            await asyncio.to_thread(self.journal.flush)
            for ann, at in accepted:
                if ann.round < self.round:
                    continue  # its round closed while the batch was committed
                book = self._book(ann.round)
                if book.slots[ann.peer].state != PeerState.PENDING:
                    continue
                book.accept(ann.peer, ann.cid, ann.num_samples, at)
                log.info(
                    "round %d: %s announced %s (%d samples)",
                    ann.round,
                    ann.peer,
                    ann.cid,
                    ann.num_samples,
                )
                if ann.round == self.round:
                    self._plan.add((ann.round, ann.peer))
                self._mark(ann.round)
            if accepted:
                self._news.set()
                self._plan_wake.set()

    # -- fetch and verify ---------------------------------------------------------------------
    async def _dispatch(self) -> None:
        """Start fetch attempts as the plan allows; wake on news or at the next retry time."""
        while True:
            key, wake = self._plan.next(self.clock())
            if key is not None:
                assert self._tg is not None
                self._attempts[key] = self._tg.create_task(self._attempt(key))
                continue
            timeout = None if wake is None else max(0.0, wake - self.clock())
            await _first(self._plan_wake, None, timeout)
            self._plan_wake.clear()

    async def _attempt(self, key: tuple[int, str]) -> None:
        r, peer = key
        book = self._books.get(r)
        if book is None or r != self.round:
            self._plan.finished(key)
            return
        slot = book.slots[peer]
        assert slot.cid is not None
        cid = CID.parse(slot.cid)
        start = time.perf_counter()
        try:
            got = await verify_input(
                self.node,
                self.store,
                peer,
                cid,
                slot.num_samples,
                expected=self._known_schema(),
                resolve_timeout_s=self.resolve_timeout_s,
                budget=self._budget,
                keep=self._keep,
                clip=self.config.clip_input_norm is not None,
                claim=Claim(
                    peer,
                    r,
                    self.config.job,
                    slot.num_samples,
                    self.run_id,
                    self.config.inputs.require_bound_meta,
                ),
            )
        except InputRefused as exc:
            self._plan.finished(key)
            self._settle_failed(book, peer, exc.reason)
        except (NodeError, TimeoutError) as exc:
            why = str(exc) or f"no answer in {self.resolve_timeout_s:.0f} s"
            retry_at = self._plan.retry(key, self.clock())
            if retry_at is None:
                self._settle_failed(
                    book,
                    peer,
                    f"unavailable: {slot.cid} could not be fetched in "
                    f"{self.fetch_attempts} attempts (last: {why})",
                )
            else:
                log.info("round %d: fetching %s failed (%s); will retry", r, slot.cid, why)
        except asyncio.CancelledError:
            self._plan.finished(key)
            raise
        except Exception as exc:  # a bug must fail this input, not the round
            log.exception("round %d: verifying %s from %s crashed", r, slot.cid, peer)
            self._plan.finished(key)
            self._settle_failed(book, peer, f"internal error: {type(exc).__name__}: {exc}")
        else:
            self._plan.finished(key)
            if r != self.round or book is not self._books.get(r):
                if got.gradient is not None:
                    self._keep.give_back(got.nbytes)
                return  # the round moved on while we verified
            self._verified[key] = got
            book.verify(peer, got.nbytes, got.schema)
            self._bytes_fetched += got.nbytes
            self.journal.set_input_state(r, peer, PeerState.VERIFIED)
            self._journal_wake.set()
            log.info("round %d: %s verified (%d bytes)", r, peer, got.nbytes)
            if self._prepared is None and isinstance(got.gradient, Gradient):
                self._prepared = asyncio.create_task(_prepare(got.gradient))
        finally:
            self._fetch_seconds += time.perf_counter() - start
            self._attempts.pop(key, None)
            self._mark(r)
            self._news.set()
            self._plan_wake.set()

    def _settle_failed(self, book: RoundBook, peer: str, reason: str) -> None:
        if book.round != self.round or book.slots[peer].state != PeerState.RECEIVED:
            return
        book.fail(peer, reason)
        self.journal.set_input_state(book.round, peer, PeerState.FAILED, reason)
        self._journal_wake.set()
        log.warning("round %d: %s failed: %s", book.round, peer, reason)

    # -- publishing ---------------------------------------------------------------------------
    def _mark(self, round_: int) -> None:
        """The status of ``round_`` changed: publish it soon (coalesced)."""
        self._dirty.add(round_)
        self._status_wake.set()

    async def _publisher(self) -> None:
        while True:
            await self._status_wake.wait()
            self._status_wake.clear()
            rounds, self._dirty = sorted(self._dirty), set()
            for r in rounds:
                book = self._books.get(r) or self._past.get(r)
                if book is not None:
                    await self._publish_status(book)
            await asyncio.sleep(STATUS_EVERY_S)

    def _stamp(self) -> int:
        return int(self.clock() * 1000)

    async def _publish_status(self, book: RoundBook, failed: str | None = None) -> None:
        status = status_of(
            book,
            self.config.roster,
            job=self.config.job,
            run=self.run_id,
            sent_at=self._stamp(),
            failed=failed,
        )
        await self._publish_fitted(status)

    async def _publish_fitted(self, msg: Any) -> None:
        try:
            data, block = encode_fitted(msg, self.key)
            if block is not None:
                await self.node.put_block(block[1], block[0].codec)
            await self.node.publish(self.config.results_topic, data)
        except NodeError as exc:  # peers re-announce and we re-broadcast: never fatal
            log.warning("publishing on %s failed: %s", self.config.results_topic, exc)

    async def _publish_result(self) -> None:
        if self._last_result is None:
            return
        msg = result_of(
            self._last_result, self._last_result_cid, self.config.roster, sent_at=self._stamp()
        )
        await self._publish_fitted(msg)

    async def _publish_failure(self) -> None:
        if self._last_failure is None:
            return
        r, reason = self._last_failure
        book = self._past.get(r) or self._books.get(r) or RoundBook(r, (), self.clock())
        await self._publish_status(book, failed=reason)

    async def _beacon(self) -> None:
        """Repeat what peers may have missed, re-signed with a fresh time."""
        while True:
            for r in sorted(self._books):
                if r == self.round or self._books[r].started_at is not None:
                    self._mark(r)
            await self._publish_result()
            await self._publish_failure()
            self._log_refusals(self.clock())  # a flood's last counts, once it stopped
            await asyncio.sleep(self.rebroadcast_s)


def format_outcome(outcome: RoundOutcome) -> str:
    """The one-line summary of a round printed by the CLI and logged."""
    s = outcome.stats
    counts = f"{s.get('verified', 0)}/{s.get('expected', 0)} verified"
    if outcome.status == "failed":
        return f"round {outcome.round} failed: {outcome.reason} ({counts})"
    return (
        f"round {outcome.round} closed: {len(outcome.peers)} peers ({counts}), "
        f"aggregate {outcome.output} record {outcome.record}, "
        f"{s.get('bytes_fetched', 0) / 1e6:.1f} MB fetched in {s.get('resolve_s', 0):.2f}s, "
        f"aggregate {s.get('aggregate_s', 0):.2f}s, publish {s.get('publish_s', 0):.2f}s"
    )


async def _first(event: asyncio.Event, stop: asyncio.Event | None, timeout: float | None) -> None:
    """Wait until ``event`` or ``stop`` is set, or ``timeout`` seconds pass."""
    waiters = [asyncio.ensure_future(event.wait())]
    if stop is not None:
        waiters.append(asyncio.ensure_future(stop.wait()))
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


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
