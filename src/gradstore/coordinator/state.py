"""The coordinator's state and its decisions: an event in, the effects to apply out; no I/O.

The service (``service.py``) reads messages, fetches inputs, writes the journal and
publishes. After each event it calls one method here and applies what comes back
(``Effects``): journal rows to queue, which of its tasks to wake (the journal writer,
the fetch dispatcher, the status publisher, the round loop), bytes to give back, pins to
drop, the kernel to prepare. What waits for a task stays queued here: accepted
announcements until their batch is committed, inputs to fetch (``FetchPlan``), rounds
whose status changed. Every decision the coordinator makes between two I/O calls is
made here, so each is tested without a network (tests/coordinator/test_state.py), as
``admission.admit`` is. The state logs what it decides; it never waits.

Events, in the order a round sees them: ``recovered`` (journal rows after a restart),
``admit`` (a raw announcement), ``accepted`` (its batch committed), ``opened``,
``fetched`` (an attempt verified, failed, or ended), ``judge`` (the round closes),
``close_succeeded`` / ``close_failed``, then ``announce_result`` / ``announce_failure``
once that is durable, and ``forget``.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from ..dag import CID
from ..errors import MessageError, Reason, reason_text
from ..format import Gradient
from ..job import JobConfig
from ..messages import (
    MAX_MESSAGE_BYTES,
    Announce,
    Result,
    RoundRecord,
    Status,
    verify_message,
)
from ..messages.refusal_log import RefusalLog
from .admission import TELL_WINDOW, AdmissionState, Verdict, admit
from .binding import Claim
from .fetch_plan import DEFAULT_ATTEMPTS, FetchPlan
from .inputs import VerifiedInput
from .progress import RoundProgress
from .rounds import (
    CloseCheck,
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

if TYPE_CHECKING:
    from .closing import Closed
    from .journal import InputRow, Journal, RoundRow

log = logging.getLogger("gradstore.coordinator")

Key = tuple[int, str]  # (round, peer)

#: Message digests remembered to drop exact replays before any work.
SEEN_MESSAGES: Final = 1 << 16

#: Refusals kept in ``recent_refusals`` (all are counted in ``refusals``).
RECENT_REFUSALS: Final = 256

#: Books of rounds no longer open that are kept to tell late peers: closed rounds, and
#: small books that only hold refusals for rounds behind or ahead. A refusal is told for
#: rounds up to ``TELL_WINDOW`` behind and ahead of the open one, so every round a peer
#: can still hear of fits, with room for the last closed ones.
PAST_ROUNDS: Final = 4 * TELL_WINDOW


# -- effects -----------------------------------------------------------------------------------
class Write(Protocol):
    """One journal row to queue (the journal writer, or the close, commits it)."""

    def to(self, journal: Journal) -> None: ...


@dataclass(frozen=True, slots=True)
class Accept:
    """An accepted announcement, with its signed bytes."""

    round: int
    peer: str
    cid: str
    num_samples: int
    message: bytes

    def to(self, journal: Journal) -> None:
        journal.accept(self.round, self.peer, self.cid, self.num_samples, self.message)


@dataclass(frozen=True, slots=True)
class SetInput:
    """An input's new state (and why, when it failed)."""

    round: int
    peer: str
    state: PeerState
    reason: str | None = None

    def to(self, journal: Journal) -> None:
        journal.set_input_state(self.round, self.peer, self.state, self.reason)


@dataclass(frozen=True, slots=True)
class CloseRound:
    round: int
    output: str
    record: str

    def to(self, journal: Journal) -> None:
        journal.close_round(self.round, self.output, self.record)


@dataclass(frozen=True, slots=True)
class FailRound:
    round: int
    reason: str

    def to(self, journal: Journal) -> None:
        journal.fail_round(self.round, self.reason)


@dataclass(frozen=True, slots=True)
class LearnSchema:
    """The schema of the job's first aggregated round, which every later input must share."""

    schema: Schema

    def to(self, journal: Journal) -> None:  # written (and committed) at once
        journal.set_meta("schema", [[n, d, list(s)] for n, d, s in self.schema])


@dataclass
class Effects:
    """What the service does after an event: queue ``writes`` (in order), wake its tasks."""

    writes: list[Write] = field(default_factory=list)  # journal rows (wake the writer)
    statuses: bool = False  # a round's status changed: wake the status publisher
    fetch: bool = False  # the fetch plan may start an attempt: wake the dispatcher
    news: bool = False  # a round may be ready to close: wake the round loop
    give_back: int = 0  # bytes of inputs no longer held, back to the keep budget
    unpin: list[CID] = field(default_factory=list)  # inputs no aggregated round holds
    prepare: Gradient | None = None  # get the aggregation kernel ready for inputs like this


@dataclass(frozen=True)
class Order:
    """What one fetch attempt verifies: an announced input and what it must bind to."""

    cid: CID
    claim: Claim
    schema: Schema | None  # the job's (configured or learned); None: any, the majority wins
    clip: bool  # the job clips inputs: measure each input's norm


@dataclass(frozen=True)
class FetchFailed:
    """An attempt that did not verify: for good (``passing=False``) or for now."""

    reason: str
    passing: bool = False


@dataclass
class Judged:
    """A closing round: who it aggregates, who it excludes and why, or why it fails."""

    round: int
    verified: tuple[str, ...]  # canonical order (sorted by peer id)
    inputs: list[VerifiedInput]  # the verified peers' inputs, in the same order
    excluded: tuple[tuple[str, str], ...]  # (peer, why)
    excluded_cids: list[tuple[str, str, str | None]]  # (peer, why, the CID it announced)
    failure: str | None
    stats: dict[str, Any]
    effects: Effects


# -- the state ---------------------------------------------------------------------------------
class CoordinatorState:
    """Everything the coordinator knows of its job's rounds, and every rule it applies."""

    def __init__(
        self,
        config: JobConfig,
        *,
        restart_grace_s: float | None = None,
        fetch_workers: int = 16,
        fetch_attempts: int = DEFAULT_ATTEMPTS,
    ) -> None:
        self.config = config
        #: after a restart past a round's deadline, how long its journaled inputs are
        #: resolved again before it is judged (default: the deadline, at most 30 s)
        self.restart_grace_s = (
            min(config.rounds.deadline_s, 30.0) if restart_grace_s is None else restart_grace_s
        )
        self.run_id = ""
        self.round = 0  # the open round; between two rounds, the next to open
        self.head: CID | None = None  # the last closed round's record
        self.books: dict[int, RoundBook] = {}  # the open round and buffered ones
        self.past: OrderedDict[int, RoundBook] = OrderedDict()  # for late peers (PAST_ROUNDS)
        self.announced: dict[Key, str] = {}  # the CID each peer announced, from the open round
        self.verified: dict[Key, VerifiedInput] = {}
        self.plan = FetchPlan(fetch_workers, attempts=fetch_attempts)
        self.learned: Schema | None = None  # the schema of the first aggregated round
        self.last_result: tuple[RoundRecord, str] | None = None  # the beacon repeats it
        self.last_failure: tuple[int, str] | None = None  # and this, (round, reason)
        # never rebound, these three: the Coordinator shows the very objects
        self.refusals: Counter[str] = Counter()  # reason -> how many, for logs and tests
        self.recent_refusals: deque[tuple[str, str]] = deque(maxlen=RECENT_REFUSALS)
        self.refusal_log = RefusalLog()  # which refusals get a line of their own
        self.bytes_fetched = 0  # by the open round's verified inputs
        self.fetch_seconds = 0.0  # summed over its attempts
        self._opened: int | None = None  # the round opened and not yet forgotten
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._accepted: list[tuple[Announce, float]] = []  # queued in the journal
        self._dirty: set[int] = set()  # rounds whose status is due
        self._prepared = False  # the kernel is prepared once per run
        self._configured: Schema | None = (
            None
            if config.schema is None
            else tuple((t.name, t.dtype, t.shape) for t in config.schema)
        )

    @property
    def schema(self) -> Schema | None:
        """The schema every input must have: the job's, or the one learned; None: not yet."""
        return self._configured if self._configured is not None else self.learned

    def book(self, round_: int) -> RoundBook | None:
        """The book of ``round_``: open or buffered, else one of the past ones kept."""
        return self.books.get(round_) or self.past.get(round_)

    # -- recovery --------------------------------------------------------------------------
    def recovered(
        self, rows: Sequence[RoundRow], schema: Any = None
    ) -> list[tuple[int, CID, bool]]:
        """Resume from the journal's round rows (and its learned ``schema`` meta).

        Returns the round records to read again, in order, as ``(round, cid, publish)``:
        each closed round not yet published (then it is), and the last one, which the
        beacon repeats. Call ``announce_result`` with each record read.
        """
        if schema is not None:
            self.learned = schema_from_json(schema)
        closed = [row for row in rows if row.state == "closed" and row.record]
        if closed:
            self.head = CID.parse(closed[-1].record or "")
        failed = [row for row in rows if row.state == "failed"]
        if failed:  # late peers of the last failed round still learn why
            self.last_failure = (failed[-1].round, failed[-1].reason or "failed")
        open_rows = [row for row in rows if row.state == "open"]
        if open_rows:
            self.round = open_rows[0].round
        elif rows:
            self.round = rows[-1].round + 1
        return [
            (row.round, CID.parse(row.record or ""), not row.published)
            for row in closed
            if not row.published or row is closed[-1]
        ]

    def remember(self, inputs: Iterable[InputRow]) -> None:
        """The inputs journaled for the open round and later ones: a peer keeps its first CID."""
        for row in inputs:
            self.announced[row.round, row.peer] = row.cid

    # -- announcements ---------------------------------------------------------------------
    def admit(self, data: bytes, now: float) -> tuple[Verdict, Effects]:
        """A raw announcement: drop a replay, verify it, admit it (``admission.admit``)."""
        if len(data) <= MAX_MESSAGE_BYTES:
            digest = hashlib.blake2b(data, digest_size=16).digest()
            if digest in self._seen:  # an exact replay: not even its signature is checked
                self.refusals[Reason.DUPLICATE] += 1
                return Verdict.DUPLICATE, Effects()
            self._seen[digest] = None
            if len(self._seen) > SEEN_MESSAGES:
                self._seen.popitem(last=False)
        cfg = self.config
        try:
            ann = verify_message(data, job=cfg.job, coordinator=cfg.coordinator, peers=cfg.roster)
        except MessageError as exc:  # before its signature proved a sender: no sender
            return self._refused(exc.code, exc.detail, None, now), Effects()
        if not isinstance(ann, Announce):
            detail = f"{type(ann).__name__} on the gradients topic"
            return self._refused(Reason.UNEXPECTED_TYPE, detail, None, now), Effects()
        state = AdmissionState(
            run=self.run_id,
            open_round=self.round,
            max_ahead=cfg.rounds.max_ahead,
            max_skew_ms=int(cfg.messages.max_clock_skew_s * 1000),
            announced=self.announced,
        )
        decision = admit(ann, state, int(now * 1000))
        if decision.verdict is Verdict.DUPLICATE:
            self.refusals[Reason.DUPLICATE] += 1
            return decision.verdict, Effects()
        if decision.verdict is Verdict.REFUSE and self._had(ann):
            # its own input of a closed round, sent again because the word of it was lost:
            # the round's status already says what became of it, a refusal would contradict it
            self.refusals[Reason.DUPLICATE] += 1
            return Verdict.DUPLICATE, Effects()
        if decision.verdict is Verdict.REFUSE:
            effects = Effects()
            if decision.tell:
                book = self.book(ann.round)
                if book is None:  # a round long over, or far ahead: a small book to say so
                    book = self._keep_past(RoundBook(ann.round, (), now))
                if book.refuse(ann.peer, decision.text):
                    effects.statuses = self._mark(ann.round)
            detail = f"{ann.peer}: {decision.text}"
            return self._refused(decision.reason or Reason.REFUSED, detail, ann.peer, now), effects
        self.announced[ann.round, ann.peer] = ann.cid
        self._accepted.append((ann, now))
        return Verdict.ACCEPT, Effects(
            writes=[Accept(ann.round, ann.peer, ann.cid, ann.num_samples, data)]
        )

    def _had(self, ann: Announce) -> bool:
        """Whether ``ann`` repeats an input that a past round verified or aggregated."""
        past = self.past.get(ann.round)
        slot = None if past is None else past.slots.get(ann.peer)
        return (
            slot is not None
            and slot.cid == ann.cid
            and slot.state in (PeerState.VERIFIED, PeerState.AGGREGATED)
        )

    def _refused(self, reason: Reason, detail: str, sender: str | None, now: float) -> Verdict:
        """Count a refusal; log it in full only if ``refusal_log`` says so (``sender``: the
        peer its signature proved, None for unauthenticated junk)."""
        self.refusals[reason] += 1
        self.recent_refusals.append((reason, detail))
        if self.refusal_log.refused(reason, sender, now):
            log.warning(
                "refused announcement: %s: %s (repeats are summed up every %.0f s)",
                reason,
                detail,
                self.refusal_log.every_s,
            )
        self.log_refusals(now)
        return Verdict.REFUSE

    def log_refusals(self, now: float) -> None:
        """Log the summary of refusals not logged one by one, when one is due."""
        line = self.refusal_log.summary(now)
        if line is not None:
            log.warning("%s", line)

    def take_accepted(self) -> list[tuple[Announce, float]]:
        """The accepted announcements queued so far: the journal writer commits them next."""
        batch, self._accepted = self._accepted, []
        return batch

    def accepted(self, batch: Sequence[tuple[Announce, float]], now: float) -> Effects:
        """``batch`` (from ``take_accepted``) is committed: enter each in its round's book."""
        effects = Effects(news=bool(batch), fetch=bool(batch))
        for ann, at in batch:
            if ann.round < self.round:
                continue  # its round closed while the batch was committed
            book = self.books.get(ann.round)
            if book is None:
                book = self.books[ann.round] = RoundBook(ann.round, self.config.peers, now)
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
                self.plan.add((ann.round, ann.peer))
            effects.statuses = self._mark(ann.round)
        return effects

    # -- rounds ----------------------------------------------------------------------------
    def opened(
        self, row: RoundRow, inputs: Iterable[InputRow], now: float
    ) -> tuple[RoundBook, Effects]:
        """Round ``row.round`` is open in the journal: its book, with the inputs accepted
        before (buffered, or before a restart) to fetch again."""
        r = row.round
        self.bytes_fetched, self.fetch_seconds = 0, 0.0
        book = self.books.get(r)
        if book is None:
            book = self.books[r] = RoundBook(r, self.config.peers, now)
        book.opened_at = row.opened_at
        for inp in inputs:  # accepted before a restart
            if inp.peer not in book.slots or book.slots[inp.peer].state != PeerState.PENDING:
                continue
            book.accept(inp.peer, inp.cid, inp.num_samples, inp.accepted_at)
            if inp.state == PeerState.FAILED:
                book.fail(inp.peer, inp.reason or "failed")
        if book.started_at is not None:  # buffered while the previous round was open
            book.started_at = max(book.started_at, book.opened_at)
        again = book.in_state(PeerState.RECEIVED)
        for peer in again:
            self.plan.add((r, peer))
        deadline = book.deadline(self.config.rounds.deadline_s)
        if again and deadline is not None and deadline <= now:
            # restarted after the deadline: the journaled inputs get a grace period to be
            # resolved again before the round is judged
            book.grace_until = now + self.restart_grace_s
        self._opened = r
        effects = Effects(statuses=self._mark(r), news=True, fetch=True)
        log.info(
            "round %d open: %d/%d peers already announced",
            r,
            book.counts()["received"],
            len(book.slots),
        )
        return book, effects

    def should_close(self, book: RoundBook, now: float) -> CloseCheck:
        """Whether the open round closes now, else when to look again (``rounds.should_close``)."""
        return should_close(book, self.config.rounds.deadline_s, now)

    def progress(self, now: float) -> RoundProgress | None:
        """The open round's counts and time left (None between rounds)."""
        book = self.books.get(self.round)
        if book is None or self._opened != self.round:
            return None
        counts = book.counts()
        deadline = book.deadline(self.config.rounds.deadline_s)
        return RoundProgress(
            round=book.round,
            expected=counts["expected"],
            received=counts["received"],
            verified=counts["verified"],
            failed=counts["failed"],
            quorum=self.config.rounds.quorum,
            deadline_in=None if deadline is None else deadline - now,
        )

    # -- fetches ---------------------------------------------------------------------------
    def order(self, key: Key) -> Order | None:
        """What fetching ``key`` verifies; None if its round is no longer the open one."""
        r, peer = key
        book = self.books.get(r)
        if book is None or r != self.round:
            return None
        slot = book.slots[peer]
        assert slot.cid is not None
        cfg = self.config
        claim = Claim(
            peer, r, cfg.job, slot.num_samples, self.run_id, cfg.inputs.require_bound_meta
        )
        return Order(CID.parse(slot.cid), claim, self.schema, cfg.clip_input_norm is not None)

    def fetched(
        self, key: Key, got: VerifiedInput | FetchFailed | None, seconds: float, now: float
    ) -> Effects:
        """An attempt ended: verified, failed (for good or for now), or with nothing (its
        round moved on, or it was cancelled). The fetch plan hears of it here only."""
        r, peer = key
        self.fetch_seconds += seconds
        effects = Effects(statuses=self._mark(r), news=True, fetch=True)
        if isinstance(got, FetchFailed) and got.passing:
            book = self.book(r)
            cid = book.slots[peer].cid if book is not None and peer in book.slots else None
            if self.plan.retry(key, now) is not None:
                log.info("round %d: fetching %s failed (%s); will retry", r, cid, got.reason)
                return effects
            got = FetchFailed(
                reason_text(
                    Reason.UNAVAILABLE,
                    f"{cid} could not be fetched in {self.plan.attempts} attempts "
                    f"(last: {got.reason})",
                )
            )
        else:
            self.plan.finished(key)
        if isinstance(got, FetchFailed):
            self._settle_failed(key, got.reason, effects)
        elif got is not None:
            self._settle_verified(key, got, effects)
        return effects

    def _settle_failed(self, key: Key, reason: str, effects: Effects) -> None:
        r, peer = key
        book = self.books.get(r)
        if r != self.round or book is None or book.slots[peer].state != PeerState.RECEIVED:
            return
        book.fail(peer, reason)
        effects.writes.append(SetInput(r, peer, PeerState.FAILED, reason))
        log.warning("round %d: %s failed: %s", r, peer, reason)

    def _settle_verified(self, key: Key, got: VerifiedInput, effects: Effects) -> None:
        r, peer = key
        book = self.books.get(r)
        if r != self.round or book is None:  # the round moved on while it was verified
            if got.gradient is not None:
                effects.give_back += got.nbytes
            return
        self.verified[key] = got
        book.verify(peer, got.nbytes, got.schema)
        self.bytes_fetched += got.nbytes
        effects.writes.append(SetInput(r, peer, PeerState.VERIFIED))
        log.info("round %d: %s verified (%d bytes)", r, peer, got.nbytes)
        if not self._prepared and isinstance(got.gradient, Gradient):
            self._prepared = True
            effects.prepare = got.gradient

    # -- closing ---------------------------------------------------------------------------
    def judge(self, book: RoundBook, now: float) -> Judged:
        """The open round closes: inputs still in flight fail, repeated CIDs fail, inputs
        off the majority schema fail (when the job has none yet); then the verdict."""
        r = book.round
        failed = cut_off(book)
        self.plan.drop_round(r)
        failed += drop_duplicate_cids(book)
        if self.schema is None:
            failed += keep_majority_schema(book)
        writes: list[Write] = [
            SetInput(r, p, PeerState.FAILED, book.slots[p].reason) for p in failed
        ]
        verdict = judge(book, self.config.rounds.quorum)
        stats: dict[str, Any] = {
            **book.counts(),
            "bytes_fetched": self.bytes_fetched,
            "resolve_s": round(self.fetch_seconds, 3),
            "open_s": round(now - book.opened_at, 3),
        }
        return Judged(
            round=r,
            verified=verdict.verified,
            inputs=[] if verdict.failure else [self.verified[r, p] for p in verdict.verified],
            excluded=verdict.excluded,
            excluded_cids=[(p, why, book.slots[p].cid) for p, why in verdict.excluded],
            failure=verdict.failure,
            stats=stats,
            effects=Effects(writes=writes),
        )

    def close_succeeded(self, round_: int, closed: Closed) -> Effects:
        """The round's aggregate and record are stored: its journal rows (commit them, then
        publish its status and ``announce_result``)."""
        book = self.books[round_]
        writes: list[Write] = []
        peers = [i.peer for i in closed.record.inputs]
        for peer in peers:
            book.slots[peer].state = PeerState.AGGREGATED
            writes.append(SetInput(round_, peer, PeerState.AGGREGATED))
        if self.schema is None:  # the first aggregated round fixes the job's schema
            learned = book.slots[peers[0]].schema
            assert learned is not None
            self.learned = learned
            writes.append(LearnSchema(learned))
        writes.append(CloseRound(round_, str(closed.output), str(closed.record_cid)))
        return Effects(writes=writes)

    def close_failed(self, round_: int, reason: str) -> Effects:
        """The round fails: its journal row (commit it, then ``announce_failure``)."""
        return Effects(writes=[FailRound(round_, reason)])

    def announce_result(self, record: RoundRecord, cid: CID) -> None:
        """``record`` is durable: the head of the history, and the result the beacon repeats."""
        self.head = cid
        self.last_result = (record, str(cid))

    def announce_failure(self, round_: int, reason: str) -> None:
        """The failure is durable: the beacon repeats it for late peers."""
        self.last_failure = (round_, reason)

    def forget(self, round_: int, *, keep_pins: bool) -> Effects:
        """The round is over: drop its inputs (their pins too, unless it aggregated them),
        keep its book for late peers, and move on to the next round."""
        book = self.books.pop(round_)
        items = [self.verified.pop(k) for k in [k for k in self.verified if k[0] == round_]]
        # one CID may be two inputs' (duplicate-cid): it stays pinned if either was aggregated
        kept = {
            i.cid.to_v1()
            for i in items
            if keep_pins and book.slots[i.peer].state == PeerState.AGGREGATED
        }
        effects = Effects()
        unpinned: set[CID] = set()
        for item in items:
            if item.gradient is not None:
                effects.give_back += item.nbytes
            cid = item.cid.to_v1()
            if cid not in kept and cid not in unpinned:
                unpinned.add(cid)
                effects.unpin.append(item.cid)
        for key in [k for k in self.announced if k[0] <= round_]:
            del self.announced[key]
        self._keep_past(book)
        self.round, self._opened = round_ + 1, None
        return effects

    def _keep_past(self, book: RoundBook) -> RoundBook:
        self.past[book.round] = book
        self.past.move_to_end(book.round)
        while len(self.past) > PAST_ROUNDS:
            self.past.popitem(last=False)
        return book

    # -- what peers hear -------------------------------------------------------------------
    def _mark(self, round_: int) -> bool:
        """The status of ``round_`` changed: it is due (coalesced). Returns True."""
        self._dirty.add(round_)
        return True

    def status(self, round_: int, sent_at: int, failed: str | None = None) -> Status | None:
        """The status of ``round_`` now (None: no book of it is kept)."""
        book = self.book(round_)
        if book is None:
            return None
        cfg = self.config
        return status_of(
            book, cfg.roster, job=cfg.job, run=self.run_id, sent_at=sent_at, failed=failed
        )

    def due_statuses(self, sent_at: int) -> list[Status]:
        """The statuses that changed since the last call, by round."""
        rounds, self._dirty = sorted(self._dirty), set()
        return [s for s in (self.status(r, sent_at) for r in rounds) if s is not None]

    def result(self, sent_at: int) -> Result | None:
        """The last result, re-stamped (None: no round closed yet)."""
        if self.last_result is None:
            return None
        record, cid = self.last_result
        return result_of(record, cid, self.config.roster, sent_at=sent_at)

    def failure(self, sent_at: int) -> Status | None:
        """The last failed round's status, re-stamped (None: no round failed)."""
        if self.last_failure is None:
            return None
        r, reason = self.last_failure
        book = self.past.get(r) or self.books.get(r) or RoundBook(r, (), 0.0)
        cfg = self.config
        return status_of(
            book, cfg.roster, job=cfg.job, run=self.run_id, sent_at=sent_at, failed=reason
        )

    def beacon(self) -> Effects:
        """What the beacon repeats besides the last result and failure: the open round's
        status, and that of every buffered round a peer already announced in."""
        for r in sorted(self.books):
            if r == self.round or self.books[r].started_at is not None:
                self._mark(r)
        return Effects(statuses=bool(self._dirty))
