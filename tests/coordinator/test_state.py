"""The coordinator's state: each event in, the effects out, with no node and no event loop.

What ``Coordinator`` decides lives in ``CoordinatorState`` (issue 26): the replay filter,
the books of past rounds, recovery from journal rows, the restart grace, the learned
schema, what the beacon repeats, and the bookkeeping of every fetch attempt. Each test is
a list of calls, as tests/coordinator/test_rules.py is for the pure rules.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gradstore.coordinator import CoordinatorState, Verdict
from gradstore.coordinator.closing import Closed
from gradstore.coordinator.inputs import VerifiedInput, check_gradient
from gradstore.coordinator.journal import InputRow, RoundRow, StepRow
from gradstore.coordinator.rounds import PeerState, Schema
from gradstore.coordinator.state import (
    PAST_ROUNDS,
    STRAY_STEPS,
    Accept,
    CloseRound,
    CloseStep,
    FailRound,
    FailStep,
    FetchFailed,
    LearnSchema,
    SetInput,
)
from gradstore.dag import CID
from gradstore.dag.cid import DAG_CBOR
from gradstore.format import Gradient
from gradstore.job import parse_job
from gradstore.messages import (
    Announce,
    RecordInput,
    Result,
    RoundRecord,
    Status,
    StepRecord,
    encode_message,
)

from .harness import key

RUN = "a" * 26
CIDS = [
    "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
    "bafkreidgvpkjawlxz6sffxzwgooowe5yt7i6wsyg236mfoks77nywkptdq",
    "bafkreiculfwg6gpeo3eevolx277diwuhohklq7guh32jpaqcoyorzl5jvy",
]
SCHEMA: Schema = (("w", "<f4", (2,)),)
RECORD = str(CID.hash(DAG_CBOR, b"a step record"))  # a dag-cbor CID, as records have


class Job:
    """A job of ``n`` peers (``rounds`` takes the job file's ``[rounds]`` keys) and its state."""

    def __init__(
        self, n: int = 2, *, grace: float | None = None, schema: bool = False, **rounds: Any
    ) -> None:
        self.coord = key(100)
        self.keys = sorted((key(i) for i in range(n)), key=lambda k: k.did)
        raw: dict[str, Any] = {
            "job": "test-job",
            "coordinator": self.coord.did,
            "peers": [k.did for k in self.keys],
            "aggregation": {"method": "mean"},
            "rounds": {"count": 1, "quorum": n, "deadline_s": 30.0, **rounds},
        }
        if schema:
            raw["schema"] = [{"name": "w", "dtype": "<f4", "shape": [2]}]
        self.config = parse_job(raw)
        self.state = CoordinatorState(self.config, restart_grace_s=grace)
        self.state.run_id = RUN
        self.now = time.time()

    @property
    def peers(self) -> list[str]:
        return [k.did for k in self.keys]

    def message(self, i: int, round_: int = 0, cid: int = 0, **kw: Any) -> bytes:
        fields: dict[str, Any] = {
            "job": self.config.job,
            "run": RUN,
            "round": round_,
            "peer": self.keys[i].did,
            "cid": CIDS[cid],
            "num_samples": 1,
            "sent_at": int(self.now * 1000),
        }
        fields.update(kw)
        return encode_message(Announce(**fields), self.keys[i])

    def announce(self, i: int, round_: int = 0, cid: int = 0, **kw: Any) -> Verdict:
        """Admit peer ``i``'s announcement and commit it, as the journal writer does."""
        verdict, _ = self.state.admit(self.message(i, round_, cid, **kw), self.now)
        self.state.accepted(self.state.take_accepted(), self.now)
        return verdict

    def open(self, round_: int, inputs: Sequence[InputRow] = (), opened_at: float = 0.0) -> Any:
        row = RoundRow(round_, opened_at or self.now, "open", None, None, None, False)
        return self.state.opened(row, inputs, self.now)

    def verified(self, i: int, round_: int = 0, cid: int = 0, schema: Schema = SCHEMA) -> Any:
        gradient = Gradient({"w": np.zeros(2, np.float32)})
        got = VerifiedInput(
            self.peers[i], CID.parse(CIDS[cid]), 1, 8, schema, None, gradient, {}, 0.1
        )
        return self.state.fetched((round_, self.peers[i]), got, 0.1, self.now)

    def closed(self, round_: int, peers: list[int]) -> Closed:
        record = RoundRecord(
            job=self.config.job,
            run=RUN,
            round=round_,
            method=self.config.method,
            params={},
            inputs=tuple(RecordInput(self.peers[i], CID.parse(CIDS[0]), 1, 1.0) for i in peers),
            excluded=(),
            output=CID.parse(CIDS[1]),
            prev=None,
            coordinator=self.coord.did,
        )
        return Closed(CID.parse(CIDS[1]), record, CID.parse(CIDS[2]), {})


# -- announcements --------------------------------------------------------------------------------
def test_an_exact_replay_is_dropped_before_its_signature_is_checked() -> None:
    job = Job()
    data = job.message(0)
    verdict, effects = job.state.admit(data, job.now)
    assert verdict is Verdict.ACCEPT
    assert effects.writes == [Accept(0, job.peers[0], CIDS[0], 1, data)]
    forged = bytearray(data)
    forged[-1] ^= 1  # a bad signature: refused, once, as such
    assert job.state.admit(bytes(forged), job.now)[0] is Verdict.REFUSE
    for _ in range(3):
        verdict, effects = job.state.admit(data, job.now)
        assert verdict is Verdict.DUPLICATE and effects.writes == [] and not effects.statuses
    assert job.state.refusals == {"bad-signature": 1, "duplicate": 3}


def test_an_accepted_announcement_enters_its_round_only_once_committed() -> None:
    job = Job()
    job.open(0)
    verdict, effects = job.state.admit(job.message(0), job.now)
    assert verdict is Verdict.ACCEPT and not effects.fetch
    assert job.state.books[0].slots[job.peers[0]].state is PeerState.PENDING
    assert job.state.plan.next(job.now) == (None, None)  # nothing to fetch before the commit
    effects = job.state.accepted(job.state.take_accepted(), job.now)
    assert effects.fetch and effects.news and effects.statuses
    assert job.state.books[0].slots[job.peers[0]].state is PeerState.RECEIVED
    assert job.state.plan.next(job.now) == ((0, job.peers[0]), None)


def test_a_told_refusal_is_told_in_its_rounds_status_once() -> None:
    job = Job()
    job.open(0)
    job.announce(0, cid=0)
    job.state.due_statuses(0)
    verdict, effects = job.state.admit(job.message(0, cid=1), job.now)  # another CID
    assert verdict is Verdict.REFUSE and effects.statuses
    (status,) = job.state.due_statuses(0)
    assert status.round == 0 and status.reasons[0].startswith("conflicting-cid")
    _, again = job.state.admit(job.message(0, cid=1, sent_at=int(job.now * 1000) + 1), job.now)
    assert not again.statuses  # the same refusal again: no news, no publish


# -- fetches --------------------------------------------------------------------------------------
def test_a_passing_failure_is_retried_then_fails_as_unavailable() -> None:
    job = Job()
    job.open(0)
    job.announce(0)
    key = (0, job.peers[0])
    for attempt in range(job.state.plan.attempts):
        started, wake = job.state.plan.next(job.now + 60 * attempt)
        assert started == key, (attempt, wake)
        effects = job.state.fetched(key, FetchFailed("timeout", passing=True), 1.0, job.now)
        assert effects.fetch  # a worker is free again
    assert effects.writes == [
        SetInput(
            0,
            job.peers[0],
            PeerState.FAILED,
            f"unavailable: {CIDS[0]} could not be fetched in 4 attempts (last: timeout)",
        )
    ]
    assert job.state.plan.running == 0 and job.state.plan.next(job.now + 600) == (None, None)
    assert job.state.books[0].refusals[job.peers[0]].startswith("unavailable")


def test_every_attempt_frees_its_worker_whatever_happened() -> None:
    job = Job(4)
    job.open(0)
    for i in range(4):
        job.announce(i)
    keys = [(0, peer) for peer in job.peers]
    assert [job.state.plan.next(job.now)[0] for _ in keys] == keys and job.state.plan.running == 4
    job.verified(0)
    job.state.fetched(keys[1], FetchFailed("too-large: 9 bytes"), 0.1, job.now)  # for good
    job.state.fetched(keys[2], None, 0.1, job.now)  # cancelled
    job.state.fetched(keys[3], FetchFailed("internal error: KeyError: 'x'"), 0.1, job.now)
    assert job.state.plan.running == 0
    assert job.state.plan.next(job.now + 600) == (None, None)  # and none comes back
    slots = job.state.books[0].slots
    assert [slots[p].state for p in job.peers] == [
        PeerState.VERIFIED,
        PeerState.FAILED,
        PeerState.RECEIVED,  # cancelled: cut off at the deadline, not failed here
        PeerState.FAILED,
    ]
    assert job.state.fetch_seconds == 0.4 and job.state.bytes_fetched == 8


def test_the_kernel_is_prepared_with_the_first_verified_gradient_only() -> None:
    job = Job(3)
    job.open(0)
    for i in range(3):
        job.announce(i)
        job.state.plan.next(job.now)
    first = job.verified(0)
    assert first.prepare is not None
    assert first.writes == [SetInput(0, job.peers[0], PeerState.VERIFIED)]
    assert job.verified(1).prepare is None


def test_an_input_verified_after_its_round_moved_on_gives_its_bytes_back() -> None:
    job = Job(2, quorum=1)
    job.open(0)
    job.announce(0)
    job.announce(1)
    job.state.plan.next(job.now)
    job.state.plan.next(job.now)
    job.verified(0)
    book = job.state.books[0]
    judged = job.state.judge(book, job.now)  # peer 1 is still being fetched: cut off
    assert judged.effects.writes == [
        SetInput(0, job.peers[1], PeerState.FAILED, "unavailable: not verified by the deadline")
    ]
    job.state.forget(0, keep_pins=False)
    late = job.verified(1)
    assert late.give_back == 8 and late.writes == [] and 1 not in job.state.books


# -- rounds ---------------------------------------------------------------------------------------
def test_a_closed_round_moves_on_at_once_and_its_late_announcements_are_stale() -> None:
    # Before issue 26 the round advanced only after the close's stats were committed, so an
    # announcement of the closed round accepted in between built a book that never went away.
    job = Job(2, max_ahead=0)
    job.open(0)
    job.state.admit(job.message(0), job.now)
    batch = job.state.take_accepted()  # being committed while the round closes
    job.state.judge(job.state.books[0], job.now)
    job.state.forget(0, keep_pins=False)
    assert job.state.round == 1 and job.state.progress(job.now) is None
    job.state.accepted(batch, job.now)
    verdict, _ = job.state.admit(job.message(1), job.now)
    assert verdict is Verdict.REFUSE and job.state.recent_refusals[-1][0] == "stale-round"
    assert job.state.books == {}


def test_the_first_aggregated_round_fixes_the_schema_for_the_next() -> None:
    job = Job(2, count=2)
    job.open(0)
    for i in range(2):
        job.announce(i, cid=i)
        job.state.plan.next(job.now)
        job.verified(i, cid=i)
    assert job.state.schema is None
    judged = job.state.judge(job.state.books[0], job.now)
    assert judged.failure is None and [i.peer for i in judged.inputs] == job.peers
    effects = job.state.close_succeeded(0, job.closed(0, [0, 1]))
    assert effects.writes == [
        SetInput(0, job.peers[0], PeerState.AGGREGATED),
        SetInput(0, job.peers[1], PeerState.AGGREGATED),
        LearnSchema(SCHEMA),
        CloseRound(0, CIDS[1], CIDS[2]),
    ]
    forget = job.state.forget(0, keep_pins=True)
    assert forget.unpin == [] and forget.give_back == 16
    job.open(1)
    job.announce(0, round_=1)
    order = job.state.order((1, job.peers[0]))
    assert order is not None and order.schema == SCHEMA
    assert order.claim.round == 1 and order.claim.run == RUN


def test_an_aggregated_peer_announcing_its_input_again_after_the_close_is_not_refused() -> None:
    # Defect (256 peers under load): a peer whose input was aggregated, but which had not yet
    # heard so, announced it again after the close; it was refused as stale-round and saw
    # itself both aggregated and refused, so it raised RefusedError for a round it was in.
    job = Job(2)
    job.open(0)
    for i in range(2):
        job.announce(i, cid=i)
        job.state.plan.next(job.now)
        job.verified(i, cid=i)
    job.state.judge(job.state.books[0], job.now)
    job.state.close_succeeded(0, job.closed(0, [0, 1]))
    job.state.forget(0, keep_pins=True)
    again = job.message(0, cid=0, sent_at=int(job.now * 1000) + 1)
    verdict, effects = job.state.admit(again, job.now)
    assert verdict is Verdict.DUPLICATE and not effects.statuses
    assert job.state.past[0].refusals == {}
    other = job.message(1, cid=2)  # not the input it had: still stale
    verdict, _ = job.state.admit(other, job.now)
    assert verdict is Verdict.REFUSE and job.state.recent_refusals[-1][0] == "stale-round"


def test_a_configured_schema_is_never_learned() -> None:
    job = Job(1, schema=True)
    assert job.state.schema == SCHEMA
    job.open(0)
    job.announce(0)
    job.state.plan.next(job.now)
    job.verified(0)
    job.state.judge(job.state.books[0], job.now)
    writes = job.state.close_succeeded(0, job.closed(0, [0])).writes
    assert not any(isinstance(w, LearnSchema) for w in writes) and job.state.learned is None


def test_a_round_without_quorum_fails_and_the_beacon_repeats_why() -> None:
    job = Job(2)
    job.open(0)
    judged = job.state.judge(job.state.books[0], job.now)
    assert judged.failure == "quorum not met: 0 verified of 2 needed"
    assert job.state.close_failed(0, judged.failure).writes == [FailRound(0, judged.failure)]
    assert job.state.failure(0) is None  # not before the journal has it
    job.state.announce_failure(0, judged.failure)
    job.state.forget(0, keep_pins=False)
    failure = job.state.failure(int(job.now * 1000))
    assert failure is not None and failure.round == 0 and failure.failed == judged.failure


def test_one_bound_for_the_books_of_past_rounds() -> None:
    # Before issue 26 closed rounds were kept 4 deep and refusal books 8 deep, in one dict
    job = Job(2, count=0, max_ahead=1)
    for r in range(3 * PAST_ROUNDS):
        job.open(r)
        job.state.forget(r, keep_pins=False)
        assert len(job.state.past) == min(r + 1, PAST_ROUNDS)
    assert list(job.state.past) == list(range(2 * PAST_ROUNDS, 3 * PAST_ROUNDS))
    open_ = job.state.round
    job.open(open_)
    for r in (open_ + 2, open_ + 3):  # told refusals for rounds too far ahead: small books
        assert job.announce(0, round_=r) is Verdict.REFUSE
    assert len(job.state.past) == PAST_ROUNDS
    assert list(job.state.past)[-2:] == [open_ + 2, open_ + 3]
    assert job.state.book(open_ - 1) is not None  # the last closed round still answers


def test_the_beacon_repeats_the_open_round_and_buffered_ones() -> None:
    job = Job(2, max_ahead=1)
    job.open(0)
    job.announce(0, round_=1)  # buffered for round 1
    job.state.due_statuses(0)
    assert job.state.beacon().statuses
    assert [s.round for s in job.state.due_statuses(0)] == [0, 1]
    job.state.forget(0, keep_pins=False)
    job.state.beacon()
    assert [s.round for s in job.state.due_statuses(0)] == [1]  # not the closed one


def test_progress_is_the_open_rounds_and_none_between_rounds() -> None:
    job = Job(3, quorum=2, deadline_s=60)
    assert job.state.progress(job.now) is None
    job.open(0)
    job.announce(0)
    progress = job.state.progress(job.now + 10)
    assert progress is not None
    assert (progress.round, progress.received, progress.verified, progress.quorum) == (0, 1, 0, 2)
    assert progress.deadline_in == 50


def test_the_open_rounds_status_says_when_its_deadline_falls_once_its_clock_runs() -> None:
    """What a waiting peer shows (issue 24, item 2) comes signed in the status: before the
    first announcement no deadline, then the clock's start plus deadline_s, in unix ms;
    a buffered round's status and a failed round's have none."""
    job = Job(2, deadline_s=30, max_ahead=1)
    job.open(0)
    job.state.beacon()
    (quiet,) = job.state.due_statuses(0)
    assert quiet.deadline is None  # the clock starts at the first announcement
    job.announce(0)
    job.announce(1, round_=1)  # buffered for round 1: its clock has not begun
    statuses = {s.round: s for s in job.state.due_statuses(0)}
    assert statuses[0].deadline == int((job.now + 30) * 1000)
    assert statuses[1].deadline is None
    job.state.announce_failure(0, "quorum not met")
    failure = job.state.failure(1)
    assert failure is not None and failure.failed and failure.deadline is None


# -- recovery -------------------------------------------------------------------------------------
def _row(r: int, state: str, published: bool = True, reason: str | None = None) -> RoundRow:
    record = CIDS[r % 3] if state == "closed" else None
    return RoundRow(r, 0.0, state, CIDS[1] if record else None, record, reason, published)


def test_recovery_rereads_unpublished_records_and_the_last_one() -> None:
    job = Job(2, count=0)
    rows = [
        _row(0, "closed", published=False),
        _row(1, "failed", reason="quorum not met"),
        _row(2, "closed"),
        _row(3, "closed"),
        _row(4, "open"),
    ]
    again = job.state.recovered(rows, [["w", "<f4", [2]]])
    assert again == [(0, CID.parse(CIDS[0]), True), (3, CID.parse(CIDS[0]), False)]
    assert job.state.round == 4 and job.state.head == CID.parse(CIDS[0])
    assert job.state.last_failure == (1, "quorum not met") and job.state.schema == SCHEMA


def test_recovery_without_an_open_round_resumes_after_the_last() -> None:
    job = Job(2, count=0)
    assert job.state.recovered([_row(0, "closed"), _row(1, "failed")]) == [
        (0, CID.parse(CIDS[0]), False)
    ]
    assert job.state.round == 2


def test_a_journaled_input_keeps_its_cid_after_a_restart() -> None:
    job = Job(2)
    job.state.recovered([_row(0, "open")])
    job.state.remember([InputRow(0, job.peers[0], CIDS[0], 1, "received", None)])
    verdict, _ = job.state.admit(job.message(0, cid=1), job.now)
    assert verdict is Verdict.REFUSE and job.state.recent_refusals[-1][0] == "conflicting-cid"
    assert job.state.admit(job.message(0, cid=0), job.now)[0] is Verdict.DUPLICATE


def test_a_restart_past_the_deadline_gives_journaled_inputs_a_grace_period() -> None:
    job = Job(2, deadline_s=60, grace=5.0)
    inputs = [
        InputRow(0, job.peers[0], CIDS[0], 1, "received", None, job.now - 100),
        InputRow(0, job.peers[1], CIDS[1], 1, "failed", "too-large: 9 bytes", job.now - 99),
    ]
    book, effects = job.open(0, inputs, opened_at=job.now - 200)  # opened before the crash
    assert effects.fetch and book.grace_until == job.now + 5.0
    assert job.state.plan.next(job.now) == ((0, job.peers[0]), None)  # fetched again
    assert not job.state.should_close(book, job.now).close
    assert job.state.should_close(book, job.now + 5.0).close


def test_the_default_restart_grace_is_the_deadline_at_most_30_s() -> None:
    assert Job(2, deadline_s=10).state.restart_grace_s == 10.0
    assert Job(2, deadline_s=600).state.restart_grace_s == 30.0


def test_the_coordinators_progress_is_round_progress_under_its_old_name_too() -> None:
    # one Progress name per meaning: gradstore.store's Progress is a byte-count callback
    from gradstore.coordinator import Progress, RoundProgress

    assert Progress is RoundProgress


# -- steps (issue 19) ------------------------------------------------------------------------------
class StepJob(Job):
    """A stepped job: step ``head`` (fc.*) of peers 0 and 1, then ``body`` (conv.*) of all
    three peers with quorum 2 and a longer deadline; ``method`` per step."""

    def __init__(self, *, schema: bool = False, **rounds: Any) -> None:
        self.coord = key(100)
        self.keys = sorted((key(i) for i in range(3)), key=lambda k: k.did)
        p = [k.did for k in self.keys]
        raw: dict[str, Any] = {
            "job": "test-job",
            "coordinator": self.coord.did,
            "peers": p,
            "aggregation": {"method": "fedavg"},
            "rounds": {"count": 1, "quorum": 3, "deadline_s": 30.0, **rounds},
            "steps": [
                {"name": "head", "tensors": ["fc.*"], "peers": p[:2], "method": "mean"},
                {"name": "body", "tensors": ["conv.*"], "quorum": 2, "deadline_s": 60.0},
            ],
        }
        if schema:
            raw["schema"] = [
                {"name": "fc.w", "dtype": "<f4", "shape": [2]},
                {"name": "conv.w", "dtype": "<f4", "shape": [3]},
            ]
        self.config = parse_job(raw)
        self.state = CoordinatorState(self.config)
        self.state.run_id = RUN
        self.now = time.time()

    def verified(
        self, i: int, round_: int = 0, cid: int = 0, schema: Schema = SCHEMA, step: str = "head"
    ) -> Any:
        gradient = Gradient({"w": np.zeros(2, np.float32)})
        got = VerifiedInput(
            self.peers[i], CID.parse(CIDS[cid]), 1, 8, schema, None, gradient, {}, 0.1
        )
        return self.state.fetched((round_, self.peers[i], step), got, 0.1, self.now)

    def closed_step(self, round_: int, step: str, peers: list[int]) -> Closed:
        record = StepRecord(
            job=self.config.job,
            run=RUN,
            round=round_,
            step=step,
            tensors=("fc.*",),
            method="mean",
            params={},
            inputs=tuple(
                RecordInput(self.peers[i], CID.parse(CIDS[0]), 1, 1.0, None, 1, bytes(64))
                for i in peers
            ),
            excluded=(),
            output=CID.parse(CIDS[1]),
            coordinator=self.coord.did,
        )
        return Closed(CID.parse(CIDS[1]), record, CID.parse(RECORD), {})


def _last_refusal(job: Job) -> str:
    return job.state.recent_refusals[-1][1]


def test_a_stepped_jobs_announcement_must_name_one_of_its_steps() -> None:
    job = StepJob()
    job.open(0)
    job.state.due_statuses(0)
    assert job.announce(0) is Verdict.REFUSE  # no step
    assert "names no step; the job's steps: head, body" in _last_refusal(job)
    assert job.announce(0, step="tail") is Verdict.REFUSE
    assert "names step 'tail'" in _last_refusal(job)
    assert job.state.refusals["unknown-step"] == 2
    # told in the status of the step it named: a peer with another job file hears why
    told = {s.step: s.reasons for s in job.state.due_statuses(0)}
    assert set(told) == {None, "tail"} and told["tail"][0].startswith("unknown-step")
    assert job.announce(0, step="head") is Verdict.ACCEPT


def test_only_a_few_step_names_the_job_does_not_have_are_told_a_round() -> None:
    job = StepJob()
    job.open(0)
    job.state.due_statuses(0)
    for n in range(3 * STRAY_STEPS):
        assert job.announce(0, step=f"x{n}") is Verdict.REFUSE
    assert len(job.state.due_statuses(0)) == STRAY_STEPS  # the others cost no publish
    assert job.state.refusals["unknown-step"] == 3 * STRAY_STEPS


def test_a_job_without_steps_refuses_an_announcement_naming_one() -> None:
    job = Job()
    job.open(0)
    job.state.due_statuses(0)
    assert job.announce(0, step="head") is Verdict.REFUSE
    assert job.state.recent_refusals[-1][0] == "unknown-step"
    assert "the job has no steps" in _last_refusal(job)
    (status,) = job.state.due_statuses(0)
    assert status.step == "head" and status.reasons[0].startswith("unknown-step")
    assert job.announce(0) is Verdict.ACCEPT
    assert job.state.books[0].refusals == {}  # the round's own book holds none of it


def test_a_peer_not_among_a_steps_peers_is_refused_and_told_in_the_steps_status() -> None:
    job = StepJob()
    job.open(0)
    job.state.due_statuses(0)
    outsider = job.peers[2]  # not one of head's peers
    verdict, effects = job.state.admit(job.message(2, step="head"), job.now)
    assert verdict is Verdict.REFUSE and effects.statuses
    assert job.state.recent_refusals[-1][0] == "not-in-step"
    (status,) = job.state.due_statuses(0)
    assert status.step == "head" and status.reasons[0].startswith("not-in-step")
    book = job.state.book(0, "head")
    assert book is not None and book.refusals == {outsider: status.reasons[0]}
    assert job.announce(2, step="body") is Verdict.ACCEPT  # its own step


def test_duplicates_and_conflicts_are_per_round_step_and_peer() -> None:
    job = StepJob()
    job.open(0)
    assert job.announce(0, cid=0, step="head") is Verdict.ACCEPT
    assert job.announce(0, cid=1, step="body") is Verdict.ACCEPT  # another step: its own CID
    again = job.message(0, cid=0, step="head", sent_at=int(job.now * 1000) + 1)
    assert job.state.admit(again, job.now)[0] is Verdict.DUPLICATE
    other = job.message(0, cid=2, step="head", sent_at=int(job.now * 1000) + 2)
    assert job.state.admit(other, job.now)[0] is Verdict.REFUSE
    assert job.state.recent_refusals[-1][0] == "conflicting-cid"
    assert job.state.announced == {
        (0, job.peers[0], "head"): CIDS[0],
        (0, job.peers[0], "body"): CIDS[1],
    }


def test_a_step_closes_on_its_own_while_another_waits_then_at_its_own_deadline() -> None:
    job = StepJob()
    job.open(0)
    for i in (0, 1):
        job.announce(i, cid=i, step="head")
    job.announce(0, step="body")  # body's other peers are late
    for _ in range(3):
        job.state.plan.next(job.now)
    job.verified(0, step="head")
    job.verified(1, cid=1, step="head")
    job.verified(0, step="body", schema=(("conv.w", "<f4", (3,)),))
    closing, wake = job.state.due(job.now)
    assert [b.step for b in closing] == ["head"]  # every head peer settled
    assert wake == job.now + 60.0  # body waits for its own deadline
    judged = job.state.judge(closing[0], job.now)
    assert judged.step == "head" and judged.failure is None
    effects = job.state.close_succeeded(0, job.closed_step(0, "head", [0, 1]), "head")
    assert effects.writes[-1] == CloseStep(0, "head", CIDS[1], RECORD)
    assert LearnSchema(SCHEMA, "head") in effects.writes
    released = job.state.release_step(0, "head")
    assert released.give_back == 16 and released.unpin == []  # memory back at once
    assert not job.state.round_done(0)
    assert job.state.due(job.now + 59.0) == ([], job.now + 60.0)
    (body,), _ = job.state.due(job.now + 60.0)  # its own deadline, with its own quorum
    judged = job.state.judge(body, job.now + 60.0)
    assert judged.failure == "quorum not met: 1 verified of 2 needed"
    assert job.state.close_failed(0, judged.failure, "body").writes == [
        FailStep(0, "body", judged.failure)
    ]
    assert job.state.round_done(0)
    assert [(d.step, d.failed) for d in job.state.round_steps(0)] == [
        ("head", None),
        ("body", judged.failure),
    ]


def test_each_steps_status_has_its_own_deadline_on_the_rounds_clock_until_it_closes() -> None:
    job = StepJob()
    job.open(0)
    for i in (0, 1):
        job.announce(i, cid=i, step="head")
    job.announce(2, step="body")
    deadlines = {s.step: s.deadline for s in job.state.due_statuses(0)}
    assert deadlines == {"head": int((job.now + 30) * 1000), "body": int((job.now + 60) * 1000)}
    for _ in range(2):
        job.state.plan.next(job.now)
    job.verified(0, step="head")
    job.verified(1, cid=1, step="head")
    job.state.close_succeeded(0, job.closed_step(0, "head", [0, 1]), "head")
    head = job.state.status(0, 1, step="head")
    assert head is not None and head.deadline is None  # closed: no deadline to wait for


def test_a_step_nobody_announced_to_closes_at_its_deadline_from_the_rounds_clock() -> None:
    job = StepJob()
    job.open(0)
    job.announce(0, step="head")  # starts the round's clock: body's too
    book = job.state.book(0, "body")
    assert book is not None and book.started_at == job.now
    closing, _ = job.state.due(job.now + 60.0)
    assert [b.step for b in closing] == ["head", "body"]


def test_an_announcement_for_a_step_that_is_over_is_stale_but_its_own_input_is_a_duplicate() -> (
    None
):
    job = StepJob()
    job.open(0)
    job.announce(0, step="head")
    job.state.plan.next(job.now)
    job.verified(0, step="head")
    (head,), _ = job.state.due(job.now + 30.0)  # its deadline: peer 1 never announced
    job.state.judge(head, job.now)
    job.state.close_succeeded(0, job.closed_step(0, "head", [0]), "head")
    again = job.message(0, step="head", sent_at=int(job.now * 1000) + 1)
    assert job.state.admit(again, job.now)[0] is Verdict.DUPLICATE
    late = job.message(1, cid=2, step="head", sent_at=int(job.now * 1000) + 1)
    assert job.state.admit(late, job.now)[0] is Verdict.REFUSE
    assert "round 0's step 'head' is over" in _last_refusal(job)
    assert job.announce(1, step="body") is Verdict.ACCEPT  # the round is still open


def test_fetches_go_to_the_step_first_in_backward_order() -> None:
    job = StepJob()
    job.open(0)
    job.announce(2, step="body")
    job.announce(1, step="body")
    job.announce(0, step="head")  # announced last, fetched first
    order = [job.state.plan.next(job.now)[0] for _ in range(3)]
    assert order == [
        (0, job.peers[0], "head"),
        (0, job.peers[2], "body"),
        (0, job.peers[1], "body"),
    ]


def test_each_step_verifies_against_its_own_tensors_and_schema() -> None:
    job = StepJob(schema=True)
    job.open(0)
    job.announce(0, step="head")
    order = job.state.order((0, job.peers[0], "head"))
    assert order is not None and order.step is not None and order.step.name == "head"
    assert order.schema == (("fc.w", "<f4", (2,)),)  # the job's schema cut to the step
    wrong = Gradient({"conv.w": np.zeros(3, np.float32)})
    _, problem, _ = check_gradient(wrong, None, False, order.step)
    assert problem is not None and problem.startswith("schema-mismatch: tensor 'conv.w'")
    right = Gradient({"fc.w": np.zeros(2, np.float32)})
    assert check_gradient(right, order.schema, False, order.step)[1] is None
    assert check_gradient(Gradient({}), None, False, order.step)[1] is not None
    plain = Job()
    plain.open(0)
    plain.announce(0)
    unstepped = plain.state.order((0, plain.peers[0]))
    assert unstepped is not None and unstepped.step is None  # no step to check


def test_each_steps_status_is_its_own_and_the_beacon_repeats_open_steps() -> None:
    job = StepJob()
    job.open(0)
    assert [(s.round, s.step) for s in job.state.due_statuses(0)] == [(0, "head")]  # untouched
    job.announce(0, step="body")
    (status,) = job.state.due_statuses(0)
    assert status.step == "body" and status.received == job.config.roster.bitmap([job.peers[0]])
    job.state.close_failed(0, "quorum not met", "head")
    job.state.beacon()
    assert [s.step for s in job.state.due_statuses(0)] == ["body"]  # head is over


def test_a_stepped_rounds_untouched_steps_are_quiet_but_for_one() -> None:
    """A step no peer announced to has nothing to tell any peer: at the round's open only
    the first step's status goes (the run, and the round is open), and the beacon repeats
    an untouched step only when nothing else goes out (64 steps cost 64 empty statuses at
    the open and at each repeat)."""
    job = ManySteps(8)
    job.open(0)
    assert [s.step for s in job.state.due_statuses(0)] == ["s00"]
    job.announce(0, step="s05")
    assert [s.step for s in job.state.due_statuses(0)] == ["s05"]
    sent = [job.period() for _ in range(16)]
    assert all(len(one) == 1 for one in sent)  # one status a period, not the 8 steps'
    assert [sent[p - 1] for p in (1, 2, 4, 8, 16)] == [[("Status", "s05")]] * 5


def test_step_results_and_failures_are_repeated_by_the_beacon() -> None:
    job = StepJob()
    job.open(0)
    closed = job.closed_step(0, "head", [0, 1])
    job.state.announce_step_result(closed.record, closed.record_cid)
    job.state.close_failed(0, "quorum not met: 0 verified of 2 needed", "body")
    job.state.announce_failure(0, "quorum not met: 0 verified of 2 needed", "body")
    job.state.beacon()  # one period after they changed: both are due
    result, status = job.state.repeats(7)
    assert isinstance(result, Result) and result.step == "head" and result.cid == CIDS[1]
    assert isinstance(status, Status) and status.step == "body" and status.failed is not None


class ManySteps(Job):
    """A stepped job of ``n`` steps (``s00`` takes tensor ``t00``, ...) over 2 peers."""

    def __init__(self, n: int) -> None:
        self.coord = key(100)
        self.keys = sorted((key(i) for i in range(2)), key=lambda k: k.did)
        self.names = [f"s{i:02d}" for i in range(n)]
        raw: dict[str, Any] = {
            "job": "test-job",
            "coordinator": self.coord.did,
            "peers": self.peers,
            "aggregation": {"method": "mean"},
            "rounds": {"count": 0, "quorum": 2, "deadline_s": 600.0},
            "steps": [{"name": s, "tensors": [f"t{s[1:]}"]} for s in self.names],
        }
        self.config = parse_job(raw)
        self.state = CoordinatorState(self.config)
        self.state.run_id = RUN
        self.now = time.time()

    def period(self) -> list[tuple[str, str | None]]:
        """One beacon period: what it sends about steps, as (kind, step), in order."""
        self.state.beacon()
        sent = [*self.state.due_statuses(0), *self.state.repeats(0)]
        return [(type(m).__name__, m.step) for m in sent]

    def closed(self, round_: int, peers: list[int], step: str = "s00") -> Closed:
        record = StepRecord(
            job=self.config.job,
            run=RUN,
            round=round_,
            step=step,
            tensors=(f"t{step[1:]}",),
            method="mean",
            params={},
            inputs=tuple(
                RecordInput(self.peers[i], CID.parse(CIDS[0]), 1, 1.0, None, 1, bytes(64))
                for i in peers
            ),
            excluded=(),
            output=CID.parse(CIDS[1]),
            coordinator=self.coord.did,
        )
        return Closed(CID.parse(CIDS[1]), record, CID.parse(RECORD), {})


def test_the_beacon_repeats_each_steps_message_with_backoff_bounded_over_time() -> None:
    """Issue 19 (the bounded beacon): 16 open steps over 64 periods. Each step's status goes
    1, 2, 4 and 8 periods after it last changed, then every 8: 11 each, not one a period
    (1,024); a period where no step is due still says something (the stalest status)."""
    n, periods = 16, 64
    job = ManySteps(n)
    job.open(0)
    for step in job.names:  # a step no peer announced to is quiet (test below)
        job.announce(0, step=step)
    assert len(job.state.due_statuses(0)) == n  # every step changed: sent at once
    sent = [job.period() for _ in range(periods)]
    assert all(len(one) >= 1 for one in sent)  # never a silent period while a round is open
    per_step = Counter(step for one in sent for _, step in one)
    keep_alive = sum(len(one) == 1 for one in sent)  # periods 3, 5, 6, 7, 9, ...: one each
    assert sum(per_step.values()) == n * (3 + periods // 8) + keep_alive
    assert sum(per_step.values()) <= n * (3 + periods // 8) + periods < n * periods // 4
    assert [len(sent[p - 1]) for p in (1, 2, 4, 8, 16)] == [n] * 5


def test_a_changed_step_goes_back_to_the_short_period() -> None:
    job = ManySteps(8)
    job.open(0)
    for step in job.names:
        job.announce(1, step=step)
    job.state.due_statuses(0)
    for _ in range(20):
        job.period()  # every step is on the 8-period cadence now (ages 16 and 24 due)
    job.announce(0, step="s03")  # its status changed: published at once
    assert [s.step for s in job.state.due_statuses(0)] == ["s03"]
    sent = [job.period() for _ in range(4)]  # periods 21-24 (age 1-4 for s03)
    assert [[step for _, step in one] for one in sent[:2]] == [["s03"], ["s03"]]
    assert sent[3] == [("Status", s) for s in job.names]  # age 4 for s03, 24 for the others
    closed = job.closed(0, [0, 1], "s05")
    job.state.announce_step_result(closed.record, closed.record_cid)  # s05's result: new
    assert ("Result", "s05") in job.period() and ("Status", "s05") not in job.period()


def test_a_re_announcement_is_answered_at_the_next_period_once() -> None:
    """A peer that missed the status saying its input was received sends it again (a
    duplicate): its step's status goes at the next period, not up to 8 periods later."""
    job = ManySteps(4)
    job.open(0)
    job.announce(0, step="s02")
    job.state.due_statuses(0)
    for _ in range(9):
        job.period()  # age 9: nothing due until 16
    again = job.message(0, step="s02", sent_at=int(job.now * 1000) + 1)
    assert job.state.admit(again, job.now)[0] is Verdict.DUPLICATE
    assert job.period() == [("Status", "s02")]
    assert ("Status", "s02") not in job.period()  # once


def test_a_job_without_steps_has_its_open_rounds_status_repeated_every_period() -> None:
    """One status a round costs one message a period: what `round status` shows within its
    few seconds stays whole, as before the bounded beacon."""
    job = Job(2, max_ahead=1)
    job.open(0)
    job.announce(0, round_=1)  # buffered for round 1, whose clock has begun
    job.state.due_statuses(0)
    for _ in range(12):
        job.state.beacon()
        assert [s.round for s in job.state.due_statuses(0)] == [0, 1]


def test_once_the_rounds_result_is_out_its_steps_are_no_longer_repeated() -> None:
    """A stepped round's round/5 record links every step's record: a peer that missed a
    step's result reads it there, so the beacon stops repeating the steps."""
    job = ManySteps(2)
    job.open(0)
    job.state.due_statuses(0)
    for step in job.names:
        closed = job.closed(0, [0, 1], step)
        job.state.announce_step_result(closed.record, closed.record_cid)
    assert job.period() == [("Result", "s00"), ("Result", "s01")]
    result = job.state.round_result(0, CID.parse(CIDS[2]), CID.parse(RECORD))
    job.state.announce_result(result, CID.parse(RECORD))
    job.state.forget(0, keep_pins=True)
    job.open(1)
    job.state.due_statuses(0)
    for _ in range(2):  # round 1's steps are new (untouched: the first one's status says
        # the round is open); round 0's result alone stands for its steps
        assert sorted(job.period(), key=str) == [("Result", None), ("Status", "s00")]
    assert job.period() == [("Result", None)]  # repeated every period: no silence


def test_a_stepped_rounds_result_joins_its_steps() -> None:
    job = StepJob(schema=True)
    job.open(0)
    job.state.close_succeeded(0, job.closed_step(0, "head", [0, 1]), "head")
    job.state.close_failed(0, "quorum not met", "body")
    done = job.state.round_result(0, CID.parse(CIDS[0]), CID.parse(RECORD))
    assert (done.step, done.output, done.record, done.method) == (None, CIDS[0], RECORD, "mean")
    assert done.peers == tuple(job.peers[:2])
    assert job.state.round_closed(0, CID.parse(CIDS[0]), CID.parse(RECORD)).writes == [
        CloseRound(0, CIDS[0], RECORD)
    ]


def test_recovery_resumes_a_rounds_steps_that_were_over() -> None:
    job = StepJob()
    job.state.recovered([_row(0, "open")], schemas={"head": [["fc.w", "<f4", [2]]]})
    rows = [
        StepRow(0, "head", "closed", CIDS[1], RECORD, None, False),
        StepRow(0, "body", "failed", None, None, "quorum not met", True),
    ]
    assert job.state.recovered_steps(rows) == [("head", CID.parse(RECORD), True)]
    assert job.state.schema_for("head") == (("fc.w", "<f4", (2,)),)
    inputs = [
        InputRow(0, job.peers[0], CIDS[0], 1, "received", None, job.now, "head"),
        InputRow(0, job.peers[1], CIDS[1], 1, "received", None, job.now, "body"),
    ]
    closed = job.closed_step(0, "head", [0])
    job.state.announce_step_result(closed.record, closed.record_cid)
    job.open(0, inputs)
    assert job.state.plan.next(job.now) == (None, None)  # both steps are over: no fetch
    assert job.state.round_done(0)


def test_progress_counts_a_stepped_rounds_steps() -> None:
    job = StepJob()
    job.open(0)
    job.announce(0, step="head")
    job.state.close_failed(0, "quorum not met", "head")
    progress = job.state.progress(job.now + 10)
    assert progress is not None
    assert (progress.steps, progress.steps_closed, progress.steps_failed) == (2, 0, 1)
    assert progress.steps_pending == 1 and progress.expected == 5 and progress.quorum == 4
    assert progress.deadline_in == 50.0  # body's: 60 s from the round's clock
    assert "steps 0/2 closed, 1 failed" in progress.line()


def test_stats_count_the_open_rounds_steps_held_bytes_and_peers() -> None:
    job = StepJob()
    job.open(0)
    job.announce(0, step="head")
    job.announce(2, step="body")
    job.state.plan.next(job.now)
    job.verified(0, step="head")  # 8 bytes kept in memory
    assert job.state.stats() == {
        "round": 0,
        "steps": {"total": 2, "completed": 0, "pending": 2, "failed": 0},
        "bytes_held": 8,
        "peers": 2,
    }
    job.state.close_failed(0, "quorum not met", "body")
    job.state.release_step(0, "head")
    stats = job.state.stats()
    assert stats["steps"] == {"total": 2, "completed": 0, "pending": 1, "failed": 1}
    assert stats["bytes_held"] == 0  # head's input left memory with its step
    plain = Job()
    plain.open(0)
    assert plain.state.stats()["steps"] == {"total": 1, "completed": 0, "pending": 1, "failed": 0}


def test_spill_files_go_with_their_step_their_round_or_an_input_that_came_too_late() -> None:
    """A closed step's inputs' spill files are let go at once (the other step keeps its own),
    the round's at its end, and a file of an input verified after its step closed at once."""
    job = StepJob()
    job.open(0)
    for i in (0, 1):
        job.announce(i, cid=i, step="head")
        job.announce(i, cid=i, step="body")
    for _ in range(4):
        job.state.plan.next(job.now)

    def spilled(i: int, step: str, schema: Schema) -> Any:
        got = VerifiedInput(
            job.peers[i], CID.parse(CIDS[i]), 1, 8, schema, None, None, {}, 0.1,
            spill=Path(f"/spill/{step}-{i}"),
        )  # fmt: skip
        return job.state.fetched((0, job.peers[i], step), got, 0.1, job.now)

    body = (("conv.w", "<f4", (3,)),)
    for i in (0, 1):
        assert spilled(i, "head", SCHEMA).unspill == []
    assert spilled(0, "body", body).unspill == []
    (head,), _ = job.state.due(job.now)
    job.state.judge(head, job.now)
    job.state.close_succeeded(0, job.closed_step(0, "head", [0, 1]), "head")
    released = job.state.release_step(0, "head")
    assert released.unspill == [Path("/spill/head-0"), Path("/spill/head-1")]
    assert released.give_back == 0  # nothing was held in memory
    assert job.state.forget(0, keep_pins=True).unspill == [Path("/spill/body-0")]
    late = spilled(1, "body", body)  # its round is over: its file goes at once
    assert late.unspill == [Path("/spill/body-1")]


def test_a_peers_inputs_go_in_turn_by_the_sizes_their_steps_schemas_give() -> None:
    """The fetch plan learns each input's size from its step's schema (here the job's
    ``[[schema]]``: head 8 bytes, body 12), so a peer whose inputs would overfill its link
    has them fetched in turn, the first step in backward order first."""
    job = StepJob(schema=True)
    job.state.plan.per_peer_bytes = 12
    job.open(0)
    job.announce(0, step="body", cid=1)
    job.announce(0, step="head")
    job.announce(1, step="head")
    first = [job.state.plan.next(job.now)[0] for _ in range(2)]
    assert first == [(0, job.peers[0], "head"), (0, job.peers[1], "head")]
    assert job.state.plan.next(job.now) == (None, None)  # 8 + 12 bytes would overfill it
    job.verified(0, step="head")
    assert job.state.plan.next(job.now)[0] == (0, job.peers[0], "body")
