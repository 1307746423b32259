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

Steps: a round has one book per step (``steps.JobSteps``; a job without steps has one, of
step None), keyed by (round, step); inputs are keyed by (round, peer) or (round, peer,
step) (``steps.Key``). Each step is judged and closed on its own (``due`` says which),
with its own deadline, quorum and schema, and gives its inputs' memory back at once
(``release_step``); a stepped round ends once every step closed or failed
(``round_done``), with a round/5 record (``round_closed``).
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..dag import CID
from ..errors import MessageError, Reason, reason_text
from ..format import Gradient
from ..job import JobConfig
from ..messages import (
    MAX_MESSAGE_BYTES,
    Announce,
    PartialRecord,
    Result,
    RoundRecord,
    Status,
    StepRecord,
    verify_message,
)
from ..messages.refusal_log import RefusalLog
from .admission import TELL_WINDOW, Admission, AdmissionState, Verdict, admit
from .beacon import Backoff
from .binding import Claim
from .effects import (
    Accept,
    CloseRound,
    CloseStep,
    Effects,
    FailRound,
    FailStep,
    FetchFailed,
    Judged,
    LearnSchema,
    Order,
    SetInput,
    Write,
)
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
    schema_bytes,
    schema_from_json,
    share_clock,
    should_close,
)
from .statuses import Announced, result_of, status_of
from .steps import ByRound, JobSteps, Key, RoundBooks, StepName, input_key, key_step

if TYPE_CHECKING:
    from .closing import Closed
    from .journal import InputRow, RoundRow, StepRow

__all__ = [
    "PAST_ROUNDS",
    "STRAY_STEPS",
    "Accept",
    "CloseRound",
    "CloseStep",
    "CoordinatorState",
    "Effects",
    "FailRound",
    "FailStep",
    "FetchFailed",
    "Judged",
    "Key",
    "LearnSchema",
    "Order",
    "SetInput",
    "StepDone",
    "Write",
]

log = logging.getLogger("gradstore.coordinator")

#: Message digests remembered to drop exact replays before any work.
SEEN_MESSAGES: Final = 1 << 16

#: Refusals kept in ``recent_refusals`` (all are counted in ``refusals``).
RECENT_REFUSALS: Final = 256

#: Books of rounds no longer open that are kept to tell late peers: closed rounds, and
#: small books that only hold refusals for rounds behind or ahead. A refusal is told for
#: rounds up to ``TELL_WINDOW`` behind and ahead of the open one, so every round a peer
#: can still hear of fits, with room for the last closed ones.
PAST_ROUNDS: Final = 4 * TELL_WINDOW

#: Step names the job does not have whose refusals (unknown-step) are told, per round.
STRAY_STEPS: Final = 4


@dataclass(frozen=True)
class StepDone:
    """A step of the open round that is over: its result once closed, or why it failed."""

    step: StepName
    result: Announced | None = None
    failed: str | None = None


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
        owner: str | None = None,
        remote_grace_s: float = 0.0,
    ) -> None:
        self.config = config
        #: the steps this coordinator runs (``owner``'s: the job's coordinator by default)
        self.steps = JobSteps(config, owner)
        #: at the root, how long past its deadline another owner's step may still report
        self.remote_grace_s = remote_grace_s
        #: at the root, when each round's clock started as the root saw it (any step's
        #: first announcement, its own or another owner's)
        self.remote_clock: dict[int, float] = {}
        #: at another owner: the last round the root's result (or failure) was heard of
        self.root_round = -1
        #: after a restart past a round's deadline, how long its journaled inputs are
        #: resolved again before it is judged (default: the deadline, at most 30 s)
        self.restart_grace_s = (
            min(config.rounds.deadline_s, 30.0) if restart_grace_s is None else restart_grace_s
        )
        self.run_id = ""
        self.round = 0  # the open round; between two rounds, the next to open
        self.head: CID | None = None  # the last closed round's record
        self.rounds: dict[int, RoundBooks] = {}  # the open round's books and buffered ones
        self.past_rounds: OrderedDict[int, RoundBooks] = OrderedDict()  # for late peers
        #: the books of a job without steps by round (live views of the two above)
        self.books, self.past = ByRound(self.rounds), ByRound(self.past_rounds)
        self.announced: dict[Key, str] = {}  # the CID each peer announced, from the open round
        self.verified: dict[Key, VerifiedInput] = {}
        self.plan = FetchPlan(fetch_workers, attempts=fetch_attempts)
        self.learned_steps: dict[StepName, Schema] = {}  # learned at each first aggregation
        self._sizes: dict[StepName, tuple[Schema | None, int]] = {}  # schema_bytes, by step
        self.done: dict[tuple[int, StepName], StepDone] = {}  # the open round's steps over
        self.last_result: Announced | None = None  # the beacon repeats it
        self.last_failure: tuple[int, str] | None = None  # and this, (round, reason)
        self.step_results: dict[str, Announced] = {}  # each step's last result (repeated)
        self.step_failures: dict[str, tuple[int, str]] = {}  # each step's last failure
        # never rebound, these three: the Coordinator shows the very objects
        self.refusals: Counter[str] = Counter()  # reason -> how many, for logs and tests
        self.recent_refusals: deque[tuple[str, str]] = deque(maxlen=RECENT_REFUSALS)
        self.refusal_log = RefusalLog()  # which refusals get a line of their own
        self.bytes_fetched = 0  # by the open round's verified inputs
        self.fetch_seconds = 0.0  # summed over its attempts
        self._step_bytes: Counter[StepName] = Counter()  # bytes_fetched by step
        self._opened: int | None = None  # the round opened and not yet forgotten
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._accepted: list[tuple[Announce, float]] = []  # queued in the journal
        self._dirty: set[tuple[int, StepName]] = set()  # (round, step) whose status is due
        #: when the beacon repeats each (round, step)'s last message (``beacon.Backoff``)
        self._backoff: Backoff[tuple[int, StepName]] = Backoff()
        self._repeat: list[tuple[int, StepName]] = []  # step results and failures due now
        self._prepared = False  # the kernel is prepared once per run

    @property
    def learned(self) -> Schema | None:
        """The schema learned at the first aggregated round of a job without steps."""
        return self.learned_steps.get(None)

    @property
    def schema(self) -> Schema | None:
        """The schema every input must have: the job's, or the one learned; None: not yet.
        (A job without steps; ``schema_for`` gives a step's.)"""
        return self.schema_for(None)

    def schema_for(self, step: StepName) -> Schema | None:
        """The schema every input to ``step`` must have: the job's ``[[schema]]`` cut to the
        step's tensors, or the one learned for the step; None: not known yet."""
        configured = self.steps.configured
        if configured is not None:
            return configured.get(step)
        return self.learned_steps.get(step)

    def _expected_bytes(self, step: StepName) -> int:
        """An input's dense size by ``step``'s schema (0: not known yet), for the fetch
        plan's per-peer bytes in flight (a compressed input counts as dense)."""
        schema = self.schema_for(step)
        cached = self._sizes.get(step)
        if cached is None or cached[0] is not schema:
            cached = self._sizes[step] = (schema, schema_bytes(schema))
        return cached[1]

    def book(self, round_: int, step: StepName = None) -> RoundBook | None:
        """The book of ``step`` of ``round_``: open or buffered, else one of the past ones kept."""
        for books in (self.rounds.get(round_), self.past_rounds.get(round_)):
            if books is not None and step in books:
                return books[step]
        return None

    def _round_books(self, round_: int, now: float) -> RoundBooks:
        """The books of every step of ``round_``, made when it is first needed."""
        books = self.rounds.get(round_)
        if books is None:
            books = self.rounds[round_] = self.steps.books(round_, now)
        return books

    # -- recovery --------------------------------------------------------------------------
    def recovered(
        self,
        rows: Sequence[RoundRow],
        schema: Any = None,
        schemas: Mapping[str, Any] | None = None,
    ) -> list[tuple[int, CID, bool]]:
        """Resume from the journal's round rows (and its learned ``schema`` meta, or a
        stepped job's learned ``schemas`` by step).

        Returns the round records to read again, in order, as ``(round, cid, publish)``:
        each closed round not yet published (then it is), and the last one, which the
        beacon repeats. Call ``announce_result`` with each record read.
        """
        if schema is not None:
            self.learned_steps[None] = schema_from_json(schema)
        for step, value in (schemas or {}).items():
            if value is not None and step in self.steps.configs:
                self.learned_steps[step] = schema_from_json(value)
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

    def recovered_steps(self, rows: Iterable[StepRow]) -> list[tuple[str, CID, bool]]:
        """Resume the open round's steps that were over before a restart: a failed one is
        over again; a closed one's record is to read again, ``(step, cid, publish)``
        (call ``announce_step_result`` with each, which marks the step closed)."""
        again = []
        for row in rows:
            if row.round != self.round or (
                row.step not in self.steps.configs and row.step not in self.steps.others
            ):
                continue
            if row.state == "failed":
                reason = row.reason or "failed"
                self.done[row.round, row.step] = StepDone(row.step, failed=reason)
                self.step_failures[row.step] = (row.round, reason)
            elif row.state == "closed" and row.record:
                mine = row.step not in self.steps.others  # the root publishes its own only
                again.append((row.step, CID.parse(row.record), mine and not row.published))
        return again

    def remember(self, inputs: Iterable[InputRow]) -> None:
        """The inputs journaled for the open round and later ones: a peer keeps its first CID."""
        for row in inputs:
            self.announced[input_key(row.round, row.peer, row.step)] = row.cid

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
        if ann.step is not None and ann.step in self.steps.others:
            return self._other_owner(ann, now), Effects()
        state = AdmissionState(
            run=self.run_id,
            open_round=self.round,
            max_ahead=cfg.rounds.max_ahead,
            max_skew_ms=int(cfg.messages.max_clock_skew_s * 1000),
            announced=self.announced,
            steps=self.steps.admission,
        )
        decision = admit(ann, state, int(now * 1000))
        if decision.verdict is Verdict.ACCEPT and self._closed_step(ann):
            decision = self._step_over(ann)
        if decision.verdict is Verdict.DUPLICATE:
            self.refusals[Reason.DUPLICATE] += 1
            self._asked(ann)
            return decision.verdict, Effects()
        if decision.verdict is Verdict.REFUSE and self._had(ann):
            # its own input of a closed round, sent again because the word of it was lost:
            # the round's status already says what became of it, a refusal would contradict it
            self.refusals[Reason.DUPLICATE] += 1
            self._asked(ann)
            return Verdict.DUPLICATE, Effects()
        if decision.verdict is Verdict.REFUSE:
            effects = Effects()
            book = self.book(ann.round, ann.step) if decision.tell else None
            if decision.tell and book is None and self._may_tell(ann.round, ann.step):
                # a round long over, or far ahead, or a step the job does not have: a small
                # book to say so
                book = self._keep_past_book(RoundBook(ann.round, (), now, step=ann.step))
            if book is not None and book.refuse(ann.peer, decision.text):
                effects.statuses = self._mark(ann.round, ann.step)
            detail = f"{ann.peer}: {decision.text}"
            return self._refused(decision.reason or Reason.REFUSED, detail, ann.peer, now), effects
        self.announced[input_key(ann.round, ann.peer, ann.step)] = ann.cid
        self._accepted.append((ann, now))
        return Verdict.ACCEPT, Effects(
            writes=[Accept(ann.round, ann.peer, ann.cid, ann.num_samples, data, ann.step)]
        )

    def _other_owner(self, ann: Announce, now: float) -> Verdict:
        """An announcement for a step another coordinator owns: its owner answers it, this
        one ignores it (a second answer would be noise); the root notes when the round's
        clock started, for the deadline of the step's result."""
        if (
            self.steps.root
            and ann.run == self.run_id
            and self.round <= ann.round <= self.round + self.config.rounds.max_ahead
        ):
            self.remote_clock.setdefault(ann.round, now)
        return Verdict.IGNORE

    def _may_tell(self, round_: int, step: StepName) -> bool:
        """Whether a refusal for ``step`` of ``round_`` may get a small book of its own: a
        step the job does not have gets one for at most ``STRAY_STEPS`` names a round."""
        if step in self.steps.configs:
            return True
        strays = [s for s in self.past_rounds.get(round_, {}) if s not in self.steps.configs]
        return len(strays) < STRAY_STEPS

    def _closed_step(self, ann: Announce) -> bool:
        """Whether ``ann`` is for a step of a stepped job that closed while its round is open."""
        return ann.step is not None and (ann.round, ann.step) in self.done

    def _step_over(self, ann: Announce) -> Admission:
        return Admission(
            Verdict.REFUSE,
            Reason.STALE_ROUND,
            f"round {ann.round}'s step {ann.step!r} is over",
            tell=True,
        )

    def _had(self, ann: Announce) -> bool:
        """Whether ``ann`` repeats an input that a past round (or a step that is over)
        verified or aggregated."""
        r, step = ann.round, ann.step
        book = self.past_rounds.get(r, {}).get(step)
        if book is None and (r, step) in self.done:
            book = self.rounds.get(r, {}).get(step)
        slot = None if book is None else book.slots.get(ann.peer)
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
        """``batch`` (from ``take_accepted``) is committed: enter each in its round's book
        (its step's, in a stepped job)."""
        effects = Effects(news=bool(batch), fetch=bool(batch))
        for ann, at in batch:
            if ann.round < self.round or (ann.round, ann.step) in self.done:
                continue  # its round (or step) closed while the batch was committed
            books = self._round_books(ann.round, now)
            book = books[ann.step]
            if book.slots[ann.peer].state != PeerState.PENDING:
                continue
            book.accept(ann.peer, ann.cid, ann.num_samples, at)
            share_clock(books.values())
            log.info(
                "round %d%s: %s announced %s (%d samples)",
                ann.round,
                _of(ann.step),
                ann.peer,
                ann.cid,
                ann.num_samples,
            )
            if ann.round == self.round:
                key = input_key(ann.round, ann.peer, ann.step)
                self.plan.add(key, self.steps.rank[ann.step], self._expected_bytes(ann.step))
            effects.statuses = self._mark(ann.round, ann.step)
        return effects

    # -- rounds ----------------------------------------------------------------------------
    def opened(
        self, row: RoundRow, inputs: Iterable[InputRow], now: float
    ) -> tuple[RoundBook, Effects]:
        """Round ``row.round`` is open in the journal: its books, with the inputs accepted
        before (buffered, or before a restart) to fetch again. Returns the book of its
        first step (a job without steps: its only one)."""
        r = row.round
        self.bytes_fetched, self.fetch_seconds = 0, 0.0
        self._step_bytes.clear()
        books = self._round_books(r, now)
        for book in books.values():
            book.opened_at = row.opened_at
        for inp in inputs:  # accepted before a restart
            into = books.get(inp.step)
            slot = None if into is None else into.slots.get(inp.peer)
            if into is None or slot is None or slot.state != PeerState.PENDING:
                continue  # a step (or a step's peer) the job file no longer has
            into.accept(inp.peer, inp.cid, inp.num_samples, inp.accepted_at)
            if inp.state == PeerState.FAILED:
                into.fail(inp.peer, inp.reason or "failed")
            elif inp.state == PeerState.AGGREGATED and (r, inp.step) in self.done:
                slot.state = PeerState.AGGREGATED
        share_clock(books.values())
        for step, book in books.items():
            if book.started_at is not None:  # buffered while the previous round was open
                book.started_at = max(book.started_at, book.opened_at)
            if (r, step) in self.done:
                continue  # closed or failed before a restart
            received = book.in_state(PeerState.RECEIVED)
            for peer in received:
                key = input_key(r, peer, step)
                self.plan.add(key, self.steps.rank[step], self._expected_bytes(step))
            deadline = book.deadline(self.steps[step].deadline_s)
            if received and deadline is not None and deadline <= now:
                # restarted after the deadline: the journaled inputs get a grace period to
                # be resolved again before the step is judged
                book.grace_until = now + self.restart_grace_s
            self._mark(r, step)
        self._opened = r
        effects = Effects(statuses=True, news=True, fetch=True)
        first = next(iter(books.values()))
        log.info(
            "round %d open: %d/%d peers already announced",
            r,
            sum(b.counts()["received"] for b in books.values()),
            sum(len(b.slots) for b in books.values()),
        )
        return first, effects

    def should_close(self, book: RoundBook, now: float) -> CloseCheck:
        """Whether the open round (the step of ``book``) closes now, else when to look again
        (``rounds.should_close``, with the step's deadline)."""
        return should_close(book, self.steps[book.step].deadline_s, now)

    def due(self, now: float) -> tuple[list[RoundBook], float | None]:
        """The open round's steps that close now (in the job's order), and when to look
        again for the others (None: only on news)."""
        books = self.rounds.get(self.round)
        if books is None or self._opened != self.round:
            return [], None
        closing: list[RoundBook] = []
        wake: float | None = None
        for step, book in books.items():
            if (self.round, step) in self.done:
                continue
            check = self.should_close(book, now)
            if check.close:
                closing.append(book)
            elif check.wake_at is not None:
                wake = check.wake_at if wake is None else min(wake, check.wake_at)
        return closing, wake

    def round_done(self, round_: int) -> bool:
        """Whether every step of ``round_`` closed or failed (at an owner that is not the
        root: every step it owns)."""
        return all((round_, step) in self.done for step in self.steps.ends)

    # -- the root: other owners' steps -----------------------------------------------------
    def remote_closed(self, record: StepRecord, cid: CID) -> Effects:
        """Another owner's step record ``cid`` (its signed result, the record checked by
        the service) closed its step: the step is over here too (journaled)."""
        step = record.step
        assert step is not None
        result = Announced.of(record, str(cid))
        self.done[record.round, step] = StepDone(step, result=result)
        log.info("round %d%s: closed by %s (%s)", record.round, _of(step), record.coordinator, cid)
        writes: list[Write] = [CloseStep(record.round, step, result.output, str(cid))]
        return Effects(writes=writes, news=True)

    def remote_failed(self, round_: int, step: str, reason: str) -> Effects:
        """Another owner's step failed (its signed status said so, or it never reported)."""
        self.done[round_, step] = StepDone(step, failed=reason)
        log.warning("round %d%s failed: %s", round_, _of(step), reason)
        return Effects(writes=[FailStep(round_, step, reason)], news=True)

    def root_heard(self, round_: int) -> None:
        """At another owner: the root's result (or failure) of ``round_`` is out, so its
        steps of that round and before are no longer repeated (peers read a missed step
        in the root's round/5 record)."""
        if round_ > self.root_round:
            self.root_round = round_
            self._steps_over(round_)

    def wants_remote(self, round_: int, step: str | None) -> bool:
        """Whether the root still waits for ``step`` of ``round_`` from its owner."""
        return (
            step is not None
            and step in self.steps.others
            and self.steps.root
            and round_ >= self.round
            and (round_, step) not in self.done
        )

    def remote_due(self, now: float) -> tuple[list[tuple[str, str]], float | None]:
        """Other owners' steps of the open round past their deadline and the close retries
        with no word from their owner: ``(step, reason)`` to fail; and when to look again."""
        r = self.round
        if not self.steps.root or self._opened != r or not self.steps.others:
            return [], None
        starts = [self.remote_clock[r]] if r in self.remote_clock else []
        starts += [b.started_at for b in self.rounds.get(r, {}).values() if b.started_at]
        if not starts:
            return [], None
        started = min(starts)
        over: list[tuple[str, str]] = []
        wake: float | None = None
        for step, owner in self.steps.others.items():
            if (r, step) in self.done:
                continue
            due = started + self._deadline_of(step) + self.remote_grace_s
            if now >= due:
                over.append(
                    (
                        step,
                        reason_text(Reason.UNAVAILABLE, f"no result from its coordinator {owner}"),
                    )
                )
            else:
                wake = due if wake is None else min(wake, due)
        return over, wake

    def _deadline_of(self, step: str) -> float:
        """The deadline (seconds from the round's clock) of any step of the job."""
        for config in self.config.steps:
            if config.name == step:
                return config.deadline_s
        raise KeyError(step)

    def progress(self, now: float) -> RoundProgress | None:
        """The open round's counts and time left (None between rounds); a stepped job's
        are summed over its steps, with the next deadline of a step still pending."""
        books = self.rounds.get(self.round)
        if books is None or self._opened != self.round:
            return None
        counts = Counter[str]()
        deadlines: list[float] = []
        quorum = 0
        for step, book in books.items():
            counts.update(book.counts())
            quorum += self.steps[step].quorum
            deadline = book.deadline(self.steps[step].deadline_s)
            if deadline is not None and (self.round, step) not in self.done:
                deadlines.append(deadline)
        over = [d for (r, s), d in self.done.items() if r == self.round and s in self.steps.configs]
        stats = self.stats()
        return RoundProgress(
            round=self.round,
            expected=counts["expected"],
            received=counts["received"],
            verified=counts["verified"],
            failed=counts["failed"],
            quorum=quorum,
            deadline_in=min(deadlines) - now if deadlines else None,
            steps=len(self.steps) if self.steps.stepped else 0,
            steps_closed=sum(d.failed is None for d in over) if self.steps.stepped else 0,
            steps_failed=sum(d.failed is not None for d in over) if self.steps.stepped else 0,
            peers=stats["peers"],
            held_bytes=stats["bytes_held"],
        )

    def stats(self) -> dict[str, Any]:
        """Where the coordinator stands: the open round, its steps (total, completed,
        pending, failed; a job without steps has one), the bytes of verified inputs held in
        memory for aggregation (every step's, under one budget), and how many peers take
        part in the round (an accepted announcement in any of its steps)."""
        r = self.round
        over = [
            d for (done_r, s), d in self.done.items() if done_r == r and s in self.steps.configs
        ]
        failed = sum(d.failed is not None for d in over)
        books = self.rounds.get(r, {})
        peers = {
            p
            for b in books.values()
            for p, slot in b.slots.items()
            if slot.state != PeerState.PENDING
        }
        return {
            "round": r,
            "steps": {
                "total": len(self.steps),
                "completed": len(over) - failed,
                "pending": len(self.steps) - len(over),
                "failed": failed,
            },
            "bytes_held": sum(v.nbytes for v in self.verified.values() if v.gradient is not None),
            "peers": len(peers),
        }

    # -- fetches ---------------------------------------------------------------------------
    def order(self, key: Key) -> Order | None:
        """What fetching ``key`` verifies; None if its round (or step) is no longer open."""
        r, peer, step = key[0], key[1], key_step(key)
        book = self.rounds.get(r, {}).get(step)
        if book is None or r != self.round or (r, step) in self.done:
            return None
        slot = book.slots[peer]
        assert slot.cid is not None
        cfg = self.config
        claim = Claim(
            peer, r, cfg.job, slot.num_samples, self.run_id, cfg.inputs.require_bound_meta
        )
        config = self.steps[step]
        return Order(
            CID.parse(slot.cid),
            claim,
            self.schema_for(step),
            config.aggregation.clip_input_norm is not None,
            config if self.steps.stepped else None,
        )

    def checked(self, key: Key) -> Effects:
        """``key``'s input passed its checks and only waits for its pin: its fetch worker
        may start another input (``FetchPlan.pinning``)."""
        self.plan.pinning(key)
        return Effects(fetch=True)

    def fetched(
        self, key: Key, got: VerifiedInput | FetchFailed | None, seconds: float, now: float
    ) -> Effects:
        """An attempt ended: verified, failed (for good or for now), or with nothing (its
        round moved on, or it was cancelled). The fetch plan hears of it here only."""
        r, step = key[0], key_step(key)
        self.fetch_seconds += seconds
        effects = Effects(statuses=self._mark(r, step), news=True, fetch=True)
        if isinstance(got, FetchFailed) and got.passing:
            book = self.book(r, step)
            slot = None if book is None else book.slots.get(key[1])
            cid = None if slot is None else slot.cid
            if self.plan.retry(key, now) is not None:
                log.info(
                    "round %d%s: fetching %s failed (%s); will retry", r, _of(step), cid, got.reason
                )
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

    def _open_book(self, key: Key) -> RoundBook | None:
        """The book ``key``'s input is for, if its round is open and its step not over."""
        r, step = key[0], key_step(key)
        if r != self.round or (r, step) in self.done:
            return None
        return self.rounds.get(r, {}).get(step)

    def _settle_failed(self, key: Key, reason: str, effects: Effects) -> None:
        r, peer, step = key[0], key[1], key_step(key)
        book = self._open_book(key)
        if book is None or book.slots[peer].state != PeerState.RECEIVED:
            return
        book.fail(peer, reason)
        effects.writes.append(SetInput(r, peer, PeerState.FAILED, reason, step))
        log.warning("round %d%s: %s failed: %s", r, _of(step), peer, reason)

    def _settle_verified(self, key: Key, got: VerifiedInput, effects: Effects) -> None:
        r, peer, step = key[0], key[1], key_step(key)
        book = self._open_book(key)
        if book is None:  # the round (or step) moved on while it was verified
            if got.gradient is not None:
                effects.give_back += got.nbytes
            if got.spill is not None:
                effects.unspill.append(got.spill)
            return
        self.verified[key] = got
        book.verify(peer, got.nbytes, got.schema)
        self.bytes_fetched += got.nbytes
        self._step_bytes[step] += got.nbytes
        effects.writes.append(SetInput(r, peer, PeerState.VERIFIED, None, step))
        log.info("round %d%s: %s verified (%d bytes)", r, _of(step), peer, got.nbytes)
        if not self._prepared and isinstance(got.gradient, Gradient):
            self._prepared = True
            effects.prepare = got.gradient

    # -- closing ---------------------------------------------------------------------------
    def judge(self, book: RoundBook, now: float) -> Judged:
        """The open round (the step of ``book``) closes: inputs still in flight fail,
        repeated CIDs fail, inputs off the majority schema fail (when the job, or the
        step, has none yet); then the verdict, with the step's quorum."""
        r, step = book.round, book.step
        failed = cut_off(book)
        self.plan.drop_where(lambda k: k[0] == r and key_step(k) == step)
        failed += drop_duplicate_cids(book)
        if self.schema_for(step) is None:
            failed += keep_majority_schema(book)
        writes: list[Write] = [
            SetInput(r, p, PeerState.FAILED, book.slots[p].reason, step) for p in failed
        ]
        verdict = judge(book, self.steps[step].quorum)
        stats: dict[str, Any] = {
            **book.counts(),
            "bytes_fetched": self._step_bytes[step] if self.steps.stepped else self.bytes_fetched,
            "resolve_s": round(self.fetch_seconds, 3),
            "open_s": round(now - book.opened_at, 3),
        }
        inputs = (
            []
            if verdict.failure
            else [self.verified[input_key(r, p, step)] for p in verdict.verified]
        )
        return Judged(
            round=r,
            verified=verdict.verified,
            inputs=inputs,
            excluded=verdict.excluded,
            excluded_cids=[(p, why, book.slots[p].cid) for p, why in verdict.excluded],
            failure=verdict.failure,
            stats=stats,
            effects=Effects(writes=writes),
            step=step,
        )

    def close_succeeded(self, round_: int, closed: Closed, step: StepName = None) -> Effects:
        """The round's (or step's) aggregate and record are stored: its journal rows (commit
        them, then publish its status and ``announce_result`` / ``announce_step_result``)."""
        book = self.rounds[round_][step]
        writes: list[Write] = []
        peers = [i.peer for i in closed.record.inputs]
        for peer in peers:
            book.slots[peer].state = PeerState.AGGREGATED
            writes.append(SetInput(round_, peer, PeerState.AGGREGATED, None, step))
        if self.schema_for(step) is None:  # the first aggregated round fixes the schema
            learned = book.slots[peers[0]].schema
            assert learned is not None
            self.learned_steps[step] = learned
            writes.append(LearnSchema(learned, step))
        output, record = str(closed.output), str(closed.record_cid)
        if step is None:
            writes.append(CloseRound(round_, output, record))
        else:
            writes.append(CloseStep(round_, step, output, record))
        self.done[round_, step] = StepDone(step, result=Announced.of(closed.record, record))
        return Effects(writes=writes)

    def close_failed(self, round_: int, reason: str, step: StepName = None) -> Effects:
        """The round (or step) fails: its journal row (commit it, then ``announce_failure``)."""
        self.done[round_, step] = StepDone(step, failed=reason)
        if step is None:
            return Effects(writes=[FailRound(round_, reason)])
        return Effects(writes=[FailStep(round_, step, reason)])

    def round_steps(self, round_: int) -> list[StepDone]:
        """How each step of a stepped ``round_`` ended, in the job's order (at the root,
        other owners' steps too)."""
        return [self.done[round_, step] for step in self.steps.ends]

    def round_closed(self, round_: int, output: CID | None, record: CID | None) -> Effects:
        """A stepped round's model-level output and round/5 record are stored: its journal
        row (commit it, then ``announce_result`` with ``round_result``). At an owner that
        is not the root, None and None: its steps are over, the root writes the rest."""
        return Effects(writes=[CloseRound(round_, str(output or ""), str(record or ""))])

    def round_result(self, round_: int, output: CID, record: CID) -> Announced:
        """What a stepped round's result says: its round/5 record and model-level output."""
        closed = [d.result for d in self.round_steps(round_) if d.result is not None]
        return Announced.of_steps(str(record), str(output), closed)

    def announce_result(self, record: RoundRecord | PartialRecord | Announced, cid: CID) -> None:
        """``record`` is durable: the head of the history, and the result the beacon repeats.
        A stepped round's steps are no longer repeated: its round/5 record links each step's
        record, where a peer that missed a step's result reads it."""
        self.head = cid
        self.last_result = (
            record if isinstance(record, Announced) else Announced.of(record, str(cid))
        )
        self._steps_over(self.last_result.round)

    def announce_step_result(self, record: StepRecord, cid: CID) -> None:
        """A step's record is durable: the beacon repeats its result; the step is over."""
        done = Announced.of(record, str(cid))
        if record.step in self.steps.others:  # another owner's (a restart): its owner repeats it
            self.done[record.round, record.step] = StepDone(record.step, result=done)
            return
        self.step_results[record.step] = done
        self._backoff.changed((record.round, record.step))
        if record.round == self.round:
            self.done[record.round, record.step] = StepDone(record.step, result=done)

    def announce_failure(self, round_: int, reason: str, step: StepName = None) -> None:
        """The failure is durable: the beacon repeats it for late peers (a round's failure
        stands for its steps', which are no longer repeated)."""
        if step is None:
            self.last_failure = (round_, reason)
            self._steps_over(round_)
        else:
            self.step_failures[step] = (round_, reason)
            self._backoff.changed((round_, step))

    def _steps_over(self, round_: int) -> None:
        """``round_`` ended and peers heard it: its steps' results and failures, and those
        of rounds before, are no longer repeated."""
        for step in [s for s, d in self.step_results.items() if d.round <= round_]:
            del self.step_results[step]
        for step in [s for s, (r, _) in self.step_failures.items() if r <= round_]:
            del self.step_failures[step]

    def release_step(self, round_: int, step: StepName) -> Effects:
        """A step is over: its inputs leave memory and give their bytes back at once (so the
        steps still open may keep theirs), and those it did not aggregate are unpinned."""
        return self._release(
            [k for k in self.verified if k[0] == round_ and key_step(k) == step], True
        )

    def _release(self, keys: list[Key], keep_pins: bool) -> Effects:
        items = [(key, self.verified.pop(key)) for key in keys]
        # one CID may be two inputs' (duplicate-cid): it stays pinned if either was aggregated
        kept = set()
        for key, item in items:
            book = self.book(key[0], key_step(key))
            if (
                keep_pins
                and book is not None
                and book.slots[item.peer].state == PeerState.AGGREGATED
            ):
                kept.add(item.cid.to_v1())
        effects = Effects()
        unpinned: set[CID] = set()
        for _, item in items:
            if item.gradient is not None:
                effects.give_back += item.nbytes
            if item.spill is not None:
                effects.unspill.append(item.spill)
            cid = item.cid.to_v1()
            if cid not in kept and cid not in unpinned:
                unpinned.add(cid)
                effects.unpin.append(item.cid)
        return effects

    def forget(self, round_: int, *, keep_pins: bool) -> Effects:
        """The round is over: drop its inputs (their pins too, unless it aggregated them),
        keep its books for late peers, and move on to the next round."""
        effects = self._release([k for k in self.verified if k[0] == round_], keep_pins)
        books = self.rounds.pop(round_)
        for key in [k for k in self.announced if k[0] <= round_]:
            del self.announced[key]
        for over in [k for k in self.done if k[0] <= round_]:
            del self.done[over]
        for r in [r for r in self.remote_clock if r <= round_]:
            del self.remote_clock[r]
        for book in books.values():
            self._keep_past_book(book)
        self._backoff.drop(lambda key: key[0] <= round_)
        self.round, self._opened = round_ + 1, None
        return effects

    def _keep_past_book(self, book: RoundBook) -> RoundBook:
        self.past_rounds.setdefault(book.round, {})[book.step] = book
        self.past_rounds.move_to_end(book.round)
        while len(self.past_rounds) > PAST_ROUNDS:
            self.past_rounds.popitem(last=False)
        return book

    # -- what peers hear -------------------------------------------------------------------
    def _mark(self, round_: int, step: StepName = None) -> bool:
        """The status of ``round_`` (of its ``step``) changed: it is due (coalesced).
        Returns True."""
        self._dirty.add((round_, step))
        self._backoff.changed((round_, step))
        return True

    def _asked(self, ann: Announce) -> None:
        """A peer sent its input again (it missed what became of it): the beacon repeats
        the step's message at its next period, once (a round not over yet)."""
        if ann.round >= self.round:
            self._backoff.ask((ann.round, ann.step))

    def status(
        self, round_: int, sent_at: int, failed: str | None = None, step: StepName = None
    ) -> Status | None:
        """The status of ``round_`` (of its ``step``) now (None: no book of it is kept); while
        the round is open and its clock runs, it says when its deadline falls."""
        book = self.book(round_, step)
        if book is None:
            return None
        cfg = self.config
        deadline = None
        step_config = self.steps.configs.get(step)  # None: a step the job does not have
        if failed is None and round_ == self._opened and (round_, step) not in self.done:
            deadline = None if step_config is None else book.deadline(step_config.deadline_s)
        return status_of(
            book,
            cfg.roster,
            job=cfg.job,
            run=self.run_id,
            sent_at=sent_at,
            failed=failed,
            deadline=deadline,
        )

    def due_statuses(self, sent_at: int) -> list[Status]:
        """The statuses that changed since the last call, by round (and step, in order);
        in a stepped job, of the steps no peer announced to only one, and only when no
        other status is due (``_untouched``)."""
        rank = self.steps.rank
        due = sorted(self._dirty, key=lambda rs: (rs[0], rank.get(rs[1], -1)))
        self._dirty = set()
        if self.steps.stepped:
            said = [key for key in due if not self._untouched(*key)]
            due = said or due[:1]
        failed = {key: d.failed for key, d in self.done.items() if d.failed is not None}
        return [
            s
            for s in (self.status(r, sent_at, failed.get((r, step)), step) for r, step in due)
            if s is not None
        ]

    def _untouched(self, round_: int, step: StepName) -> bool:
        """Whether the open step ``step`` of ``round_`` has nothing to say to any peer: no
        input received, none refused. A stepped job publishes such a status only when no
        other is due (at the round's open, the first step's; as the beacon's last resort):
        it tells a peer the run and that the round is open, which one step's status does
        for all, and no peer waits on it (64 of them went out at each open and at each of
        the beacon's repeats, a third of a 64-step round's messages)."""
        book = self.book(round_, step)
        return (
            book is not None
            and (round_, step) not in self.done
            and not book.refusals
            and all(slot.state == PeerState.PENDING for slot in book.slots.values())
        )

    def result(self, sent_at: int) -> Result | None:
        """The last result, re-stamped (None: no round closed yet)."""
        if self.last_result is None:
            return None
        return result_of(
            self.last_result, self.last_result.record, self.config.roster, sent_at=sent_at
        )

    def step_result(self, step: str, sent_at: int) -> Result | None:
        """The last result of ``step``, re-stamped (None: it has not closed yet)."""
        done = self.step_results.get(step)
        if done is None:
            return None
        return result_of(done, done.record, self.config.roster, sent_at=sent_at)

    def failure(self, sent_at: int, step: StepName = None) -> Status | None:
        """The last failed round's (or ``step``'s) status, re-stamped (None: none failed)."""
        last = self.last_failure if step is None else self.step_failures.get(step)
        if last is None:
            return None
        r, reason = last
        book = self.book(r, step) or RoundBook(r, (), 0.0, step=step)
        cfg = self.config
        return status_of(
            book, cfg.roster, job=cfg.job, run=self.run_id, sent_at=sent_at, failed=reason
        )

    def beacon(self) -> Effects:
        """A beacon period begins: what it repeats for peers that missed it, besides the
        round's last result and failure (``repeats``). Each step's last message (an open
        step's status, in the open round or in a buffered one a peer already announced in;
        a closed step's result; a failed step's failure) is repeated with backoff since it
        last changed (``beacon.Backoff``); while a round is open and nothing else would go
        out, the message repeated longest ago goes, so peers never hear silence. A job
        without steps has one status a round: it goes every period, as its result does."""
        backoff = self._backoff
        backoff.next_period()
        open_steps = [
            (r, step)
            for r in sorted(self.rounds)
            for step, book in self.rounds[r].items()
            if (r, step) not in self.done and (r == self.round or book.started_at is not None)
        ]
        over = [(done.round, step) for step, done in self.step_results.items()]
        over += [(r, step) for step, (r, _) in self.step_failures.items()]
        every = () if self.steps.stepped else open_steps
        due = [key for key in (*open_steps, *over) if backoff.due(key) or key in every]
        said = self.last_result is not None or self.last_failure is not None
        if not due and not said and self.round in self.rounds:
            stalest = backoff.stalest((*open_steps, *over))
            due = [] if stalest is None else [stalest]
        backoff.sent(due)
        statuses = set(open_steps)
        self._dirty.update(key for key in due if key in statuses)
        self._repeat = [key for key in due if key not in statuses]
        return Effects(statuses=bool(self._dirty))

    def repeats(self, sent_at: int) -> list[Result | Status]:
        """What the beacon repeats in this period (``beacon`` began it) besides statuses:
        the last result and failure, and each step's result or failure that is due."""
        out: list[Result | Status | None] = [self.result(sent_at), self.failure(sent_at)]
        for r, step in self._repeat:
            assert step is not None  # a job without steps has no step results
            done, failed = self.step_results.get(step), self.step_failures.get(step)
            if done is not None and done.round == r:
                out.append(self.step_result(step, sent_at))
            elif failed is not None and failed[0] == r:
                out.append(self.failure(sent_at, step))
        self._repeat = []
        return [m for m in out if m is not None]


def _of(step: StepName) -> str:
    """`` step NAME`` for a log line of a stepped job's step, else nothing."""
    return "" if step is None else f" step {step}"
