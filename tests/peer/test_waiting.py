"""What a waiting peer shows of its round (issue 24, item 2), from its coordinator's signed
statuses: ``peer._waiting`` is pure, so these run on hand-built, verified messages. A step's
own counts and deadline; a stepped round awaited whole sums its steps', as the coordinator's
own "waiting for peers" line does, with the next deadline of a step still open."""

from __future__ import annotations

from gradstore.dag import CID
from gradstore.dag.cid import RAW
from gradstore.messages import Result, Status, inline_lists
from gradstore.peer._view import CoordinatorView
from gradstore.peer._waiting import RoundWait, round_wait

from ..coordinator.harness import make_job
from .scripted import RUN, record_cid, stepped_job

CONFIG, _, KEYS = stepped_job()  # head (2 peers), body (peer 0), embed (2 peers); quorum 1
A, B = (k.did for k in KEYS)
ROSTER = CONFIG.roster
T0 = 1_700_000_000_000


def _status(step: str | None, at: int, verified: tuple[str, ...], deadline: int | None) -> Status:
    return Status(CONFIG.job, RUN, 0, step=step, received=ROSTER.bitmap(verified),
                  verified=ROSTER.bitmap(verified), refused=ROSTER.bitmap([]), reasons=(),
                  sent_at=at, deadline=deadline)  # fmt: skip


def _view() -> CoordinatorView:
    view = CoordinatorView(ROSTER, ("head", "body", "embed"))
    for step, verified, deadline in (
        ("head", (A, B), T0 + 30_000),
        ("body", (), T0 + 60_000),
        ("embed", (A,), T0 + 20_000),
    ):
        status = _status(step, T0, verified, deadline)
        view.see_status(status, inline_lists(status))
    return view


def test_a_step_shows_its_own_counts_and_deadline() -> None:
    wait = round_wait(_view(), CONFIG, 0, "head", T0)
    assert wait == RoundWait(0, "head", 2, 2, 2, 1, T0 + 30_000)
    assert wait.counts(T0 + 5_000) == "2/2 verified, 2 received, quorum 1, deadline in 25 s"


def test_a_stepped_round_whole_sums_its_steps_and_shows_the_next_open_deadline() -> None:
    view = _view()
    embed = Result(CONFIG.job, RUN, 0, step="embed", cid=str(CID.hash(RAW, b"embed")),
                   record=str(record_cid("embed")), method="mean", peers=ROSTER.bitmap([A]),
                   sent_at=T0 + 1)  # fmt: skip
    view.see_result(embed, inline_lists(embed))  # embed closed: its deadline no longer counts
    wait = round_wait(view, CONFIG, 0, None, T0)
    assert wait is not None
    assert (wait.verified, wait.received, wait.expected, wait.quorum) == (3, 3, 5, 3)
    assert (wait.deadline_ms, wait.steps, wait.steps_ended) == (T0 + 30_000, 3, 1)
    assert wait.counts(T0) == (
        "steps 1/3 ended; 3/5 verified, 3 received, quorum 3, deadline in 30 s"
    )


def test_nothing_heard_of_the_round_or_stamped_before_listening_shows_nothing() -> None:
    assert (
        round_wait(CoordinatorView(ROSTER, ("head", "body", "embed")), CONFIG, 0, None, 0) is None
    )
    assert round_wait(_view(), CONFIG, 0, "head", T0 + 1) is None  # a replay, for all we know
    assert round_wait(_view(), CONFIG, 1, "head", T0) is None


def test_a_job_without_steps_before_its_clock_starts() -> None:
    config, _, _ = make_job(3, quorum=2)
    view = CoordinatorView(config.roster)
    none = config.roster.bitmap([])
    status = Status(config.job, RUN, 0, received=none, verified=none, refused=none, reasons=(),
                    sent_at=T0)  # fmt: skip
    view.see_status(status, inline_lists(status))
    wait = round_wait(view, config, 0, None, 0)
    assert wait is not None
    assert wait.counts(T0) == (
        "0/3 verified, 0 received, quorum 2, the deadline starts at the first announcement"
    )
