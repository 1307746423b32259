"""The coordinator's decisions as plain functions: admission, round closing, fetch planning.

No node, no event loop: every hostile sequence is a list of calls.
"""

from __future__ import annotations

import random

import pytest

from gradstore.coordinator import AdmissionState, RoundBook, Verdict, admit
from gradstore.coordinator.fetch_plan import FetchPlan
from gradstore.coordinator.rounds import (
    PeerState,
    cut_off,
    judge,
    keep_majority_schema,
    should_close,
)
from gradstore.messages import Announce

from .harness import key

RUN = "a" * 26
NOW_MS = 1_800_000_000_000
PEERS = sorted(key(i).did for i in range(4))
CIDS = [
    "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
    "bafkreidgvpkjawlxz6sffxzwgooowe5yt7i6wsyg236mfoks77nywkptdq",
]


def _ann(peer: int = 0, round_: int = 0, cid: int = 0, **kw: object) -> Announce:
    fields: dict[str, object] = {
        "job": "j",
        "run": RUN,
        "round": round_,
        "peer": PEERS[peer],
        "cid": CIDS[cid],
        "num_samples": 1,
        "sent_at": NOW_MS,
    }
    fields.update(kw)
    return Announce(**fields)  # type: ignore[arg-type]


def _state(
    open_round: int = 0, announced: dict[tuple[int, str], str] | None = None
) -> AdmissionState:
    return AdmissionState(
        run=RUN, open_round=open_round, max_ahead=1, max_skew_ms=120_000, announced=announced or {}
    )


# --- admission ---------------------------------------------------------------------------------


def test_a_fresh_announcement_of_the_open_or_next_round_is_accepted() -> None:
    assert admit(_ann(), _state(), NOW_MS).verdict is Verdict.ACCEPT
    assert admit(_ann(round_=1), _state(), NOW_MS).verdict is Verdict.ACCEPT


@pytest.mark.parametrize(
    ("ann", "state", "reason", "tell"),
    [
        (_ann(run="b" * 26), _state(), "wrong-run", False),  # another run of the same job
        (_ann(sent_at=NOW_MS - 121_000), _state(), "clock-skew", False),  # an old replay
        (_ann(sent_at=NOW_MS + 121_000), _state(), "clock-skew", False),  # from the future
        (_ann(round_=2), _state(3), "stale-round", True),
        (_ann(round_=5), _state(3), "future-round", True),
        (_ann(cid=1), _state(announced={(0, PEERS[0]): CIDS[0]}), "conflicting-cid", True),
    ],
)
def test_refusals_say_why_and_whether_the_peer_hears_it(
    ann: Announce, state: AdmissionState, reason: str, tell: bool
) -> None:
    decision = admit(ann, state, NOW_MS)
    assert decision.verdict is Verdict.REFUSE
    assert decision.reason == reason and decision.tell is tell
    assert decision.text.startswith(reason + ": ")


def test_rounds_far_behind_or_ahead_are_refused_without_a_status() -> None:
    # each told refusal costs a status for its round: a peer naming thousands of rounds
    # must not buy thousands of publishes
    assert admit(_ann(round_=8), _state(10), NOW_MS).tell
    assert not admit(_ann(round_=7), _state(10), NOW_MS).tell
    assert admit(_ann(round_=13), _state(10), NOW_MS).tell
    assert not admit(_ann(round_=14), _state(10), NOW_MS).tell
    assert not admit(_ann(round_=2**40), _state(10), NOW_MS).tell


def test_the_same_cid_again_is_a_duplicate_that_costs_nothing() -> None:
    decision = admit(_ann(), _state(announced={(0, PEERS[0]): CIDS[0]}), NOW_MS)
    assert decision.verdict is Verdict.DUPLICATE and not decision.tell


def test_random_hostile_sequences_accept_each_peer_once_per_round() -> None:
    rng = random.Random(7)
    announced: dict[tuple[int, str], str] = {}
    open_round = 0
    for step in range(5_000):
        if rng.random() < 0.01:
            open_round += 1
        ann = _ann(
            peer=rng.randrange(4),
            round_=max(0, open_round + rng.randrange(-2, 3)),
            cid=rng.randrange(2),
            run=RUN if rng.random() < 0.9 else "c" * 26,
            sent_at=NOW_MS + rng.randrange(-200_000, 200_000),
        )
        decision = admit(ann, _state(open_round, announced), NOW_MS)
        k = (ann.round, ann.peer)
        if decision.verdict is Verdict.ACCEPT:
            assert k not in announced, f"step {step}: accepted twice"
            assert ann.run == RUN and open_round <= ann.round <= open_round + 1
            assert abs(ann.sent_at - NOW_MS) <= 120_000
            announced[k] = ann.cid
        elif decision.verdict is Verdict.DUPLICATE:
            assert announced[k] == ann.cid


# --- rounds ------------------------------------------------------------------------------------


def test_a_rounds_clock_starts_at_its_first_announcement() -> None:
    book = RoundBook(0, tuple(PEERS), opened_at=100.0)
    # nobody has announced: however long the peers take to get ready, the round waits
    assert should_close(book, 60.0, 10_000.0).close is False
    assert should_close(book, 60.0, 10_000.0).wake_at is None
    book.accept(PEERS[0], CIDS[0], 1, at=500.0)
    assert should_close(book, 60.0, 520.0).wake_at == 560.0
    assert should_close(book, 60.0, 560.0).close is True


def test_an_announcement_buffered_before_the_round_opened_starts_its_clock_at_the_opening() -> None:
    book = RoundBook(1, tuple(PEERS), opened_at=100.0)
    book.accept(PEERS[0], CIDS[0], 1, at=40.0)
    assert book.started_at == 100.0


def test_a_round_closes_early_once_every_peer_is_settled() -> None:
    book = RoundBook(0, tuple(PEERS), opened_at=0.0)
    for i, p in enumerate(PEERS):
        book.accept(p, CIDS[0], 1, at=1.0)
        if i % 2:
            book.fail(p, "non-finite: tensor 'w' holds NaN or Inf")
        else:
            book.verify(p, 10, (("w", "<f4", (2,)),))
    check = should_close(book, 60.0, 2.0)
    assert check.close and check.why == "every peer settled"


def test_after_a_late_restart_journaled_inputs_get_a_grace_period() -> None:
    book = RoundBook(0, tuple(PEERS), opened_at=0.0)
    book.accept(PEERS[0], CIDS[0], 1, at=1.0)
    book.accept(PEERS[1], CIDS[0], 1, at=1.0)
    book.grace_until = 130.0  # restarted at t=100, long after the deadline (t=61)
    assert should_close(book, 60.0, 100.0) == should_close(book, 60.0, 100.0)
    assert not should_close(book, 60.0, 100.0).close  # they are being resolved again
    book.verify(PEERS[0], 10, (("w", "<f4", (2,)),))
    book.verify(PEERS[1], 10, (("w", "<f4", (2,)),))
    assert should_close(book, 60.0, 101.0).close  # none in flight: judge it now
    verdict = judge(book, quorum=2)
    assert verdict.failure is None and verdict.verified == tuple(PEERS[:2])


def test_at_the_deadline_inputs_in_flight_are_cut_off_and_the_quorum_decides() -> None:
    book = RoundBook(0, tuple(PEERS), opened_at=0.0)
    book.accept(PEERS[0], CIDS[0], 1, at=1.0)
    book.accept(PEERS[1], CIDS[0], 1, at=1.0)
    book.verify(PEERS[0], 10, (("w", "<f4", (2,)),))
    assert cut_off(book) == [PEERS[1]]
    verdict = judge(book, quorum=2)
    assert verdict.failure == "quorum not met: 1 verified of 2 needed"
    assert dict(verdict.excluded)[PEERS[1]].startswith("unavailable")
    assert dict(verdict.excluded)[PEERS[2]] == "absent: never announced"
    assert book.refusals[PEERS[1]].startswith("unavailable")  # peers hear of it


def test_the_majority_schema_wins_and_ties_go_to_the_lowest_peer() -> None:
    book = RoundBook(0, tuple(PEERS), opened_at=0.0)
    a, b = (("w", "<f4", (2,)),), (("w", "<f4", (3,)),)
    for p, schema in zip(PEERS, (b, a, a, b), strict=True):
        book.accept(p, CIDS[0], 1, at=1.0)
        book.verify(p, 10, schema)
    assert keep_majority_schema(book) == [PEERS[1], PEERS[2]]  # 2-2 tie: PEERS[0] holds b
    assert book.slots[PEERS[1]].state is PeerState.FAILED


# --- fetch plan --------------------------------------------------------------------------------


def test_a_failed_attempt_gives_its_worker_back_and_honest_inputs_go_first() -> None:
    plan = FetchPlan(workers=4, attempts=4, first_delay_s=1.0)
    bad = [(0, f"bad{i}") for i in range(6)]
    for k in bad:
        plan.add(k)
    started = [plan.next(0.0)[0] for _ in range(4)]
    assert started == bad[:4] and plan.next(0.0) == (None, None)  # every worker busy
    for k in started:
        assert plan.retry(k, now=2.0) == 3.0  # back off 1 s, without holding the worker
    plan.add((0, "honest"))
    # the two bad inputs still waiting for a first attempt, then the honest one, go before
    # any retry; retries wait for their time and may use only half of the workers
    assert [plan.next(2.0)[0] for _ in range(3)] == [bad[4], bad[5], (0, "honest")]
    assert plan.next(2.0) == (None, 3.0)
    plan.finished((0, "honest"))
    plan.finished(bad[4])
    plan.finished(bad[5])
    assert plan.next(3.0)[0] == bad[0] and plan.next(3.0)[0] == bad[1]
    assert plan.next(3.0) == (None, None)  # 2 retries running: the other 2 workers stay free


def test_an_input_waiting_for_its_pin_gives_its_worker_back() -> None:
    """Pins wait on the node (its lock and disk sync): an attempt that only waits for its
    pin frees its worker for the next fetch, yet its input is neither queued again nor
    forgotten, and a failed pin is retried as any passing failure."""
    plan = FetchPlan(workers=1, attempts=2, first_delay_s=1.0)
    for k in [(0, "a"), (0, "b"), (0, "c")]:
        plan.add(k)
    assert plan.next(0.0)[0] == (0, "a") and plan.next(0.0) == (None, None)
    plan.pinning((0, "a"))
    assert plan.running == 0
    plan.add((0, "a"))  # announced again while it pins: not queued twice
    assert plan.next(0.0)[0] == (0, "b")
    plan.pinning((0, "b"))
    assert plan.next(0.0)[0] == (0, "c")
    plan.finished((0, "a"))
    assert plan.retry((0, "b"), now=0.0) == 1.0  # its pin failed: its second attempt
    plan.finished((0, "c"))
    assert plan.next(1.0)[0] == (0, "b") and plan.next(1.0) == (None, None)


def test_each_input_has_a_bounded_budget() -> None:
    plan = FetchPlan(workers=2, attempts=3, first_delay_s=0.5, max_delay_s=1.0)
    plan.add((0, "p"))
    now = 0.0
    retries = []
    while True:
        k, wake = plan.next(now)
        if k is None:
            assert wake is not None
            now = wake
            continue
        again = plan.retry(k, now)
        if again is None:
            break
        retries.append(again - now)
    assert retries == [0.5, 1.0]  # 3 attempts in all, then it fails as unavailable
    assert plan.next(now) == (None, None)


def test_progress_lines_say_what_the_round_waits_for() -> None:
    from gradstore.coordinator import RoundProgress

    waiting = RoundProgress(0, 3, 0, 0, 0, 2, None)
    assert waiting.line() == (
        "round 0: waiting for peers (0/3 verified, 0 received, quorum 2, "
        "the deadline starts at the first announcement)"
    )
    assert RoundProgress(1, 3, 2, 1, 1, 2, 41.4).line() == (
        "round 1: waiting for peers (1/3 verified, 2 received, 1 refused, quorum 2, "
        "deadline in 41 s)"
    )


def test_a_peers_big_inputs_are_fetched_in_turn_in_backward_order() -> None:
    """A peer's inputs come over its one uplink: fetched all at once they share it and
    its first step arrives no sooner than its last. Its first attempts wait while its
    inputs in flight hold ``per_peer_bytes`` (one always may run), the first steps first;
    the others' inputs are not held back, nor retries."""
    mib = 1 << 20
    plan = FetchPlan(workers=8, per_peer_bytes=8 * mib)
    for step in reversed(range(5)):  # announced in any order
        plan.add((0, "slow", f"s{step}"), rank=step, size=5 * mib)
    plan.add((0, "other", "s4"), rank=4, size=5 * mib)
    started = [plan.next(0.0)[0] for _ in range(2)]
    assert started == [(0, "slow", "s0"), (0, "other", "s4")]
    assert plan.next(0.0) == (None, None)  # workers are free, but "slow"'s link is full
    plan.finished((0, "slow", "s0"))
    assert plan.next(0.0)[0] == (0, "slow", "s1") and plan.next(0.0) == (None, None)
    plan.pinning((0, "slow", "s1"))  # only waits for its pin: its uplink is free again
    assert plan.next(0.0)[0] == (0, "slow", "s2")
    assert plan.retry((0, "slow", "s2"), now=0.0) == 0.5  # s2 leaves, s3 goes
    assert plan.next(0.0)[0] == (0, "slow", "s3")
    assert plan.next(0.0) == (None, 0.5)
    # s2's retry is not held (retries run on at most half of the workers) but counts
    assert plan.next(0.5)[0] == (0, "slow", "s2")
    plan.finished((0, "slow", "s3"))
    assert plan.next(0.5) == (None, None)  # s2's retry holds its link: s4 waits
    plan.finished((0, "slow", "s2"))
    assert plan.next(0.5)[0] == (0, "slow", "s4")


def test_small_inputs_and_inputs_of_unknown_size_run_side_by_side() -> None:
    """Where steps are small (loopback's fetches are short of CPU, not of bandwidth) or
    their size is not known yet, a peer's inputs run side by side as before."""
    plan = FetchPlan(workers=16, per_peer_bytes=8 << 20)
    for step in range(8):
        plan.add((0, "p", f"small{step}"), rank=step, size=1 << 20)
    for step in range(4):
        plan.add((0, "p", f"unknown{step}"), rank=8 + step)
    assert [plan.next(0.0)[0] for _ in range(12)] == [
        *[(0, "p", f"small{step}") for step in range(8)],
        *[(0, "p", f"unknown{step}") for step in range(4)],
    ]
    plan.add((0, "p", "big"), rank=20, size=1 << 20)
    assert plan.next(0.0) == (None, None)  # 8 MiB in flight: the ninth MiB waits
    plan.finished((0, "p", "small0"))
    assert plan.next(0.0)[0] == (0, "p", "big")


def test_a_held_input_of_a_dropped_step_is_forgotten() -> None:
    plan = FetchPlan(workers=4, per_peer_bytes=1)
    for step in range(3):
        plan.add((0, "p", f"s{step}"), rank=step, size=1)
    assert plan.next(0.0)[0] == (0, "p", "s0")
    assert plan.next(0.0) == (None, None)
    plan.drop_where(lambda k: k[2] == "s1")  # s1 closed without it
    plan.finished((0, "p", "s0"))
    assert plan.next(0.0)[0] == (0, "p", "s2") and plan.next(0.0) == (None, None)
