"""What a peer makes of its coordinator's per-step statuses and results (issue 19 part 6):
``peer._view`` is pure, so these run without a network on hand-built, verified messages."""

from __future__ import annotations

from gradstore.dag import CID
from gradstore.dag.cid import RAW
from gradstore.messages import PeerLists, Result, Status, inline_lists
from gradstore.peer._view import CoordinatorView, Standing

from .scripted import RUN, record_cid, stepped_job

CONFIG, _, KEYS = stepped_job()
A, B = (k.did for k in KEYS)
ROSTER = CONFIG.roster
STEPS = ("head", "body", "embed")


def _view() -> CoordinatorView:
    return CoordinatorView(ROSTER, STEPS)


def _status(
    step: str | None, at: int, *, verified: tuple[str, ...] = (), failed: str | None = None
) -> tuple[Status, PeerLists]:
    msg = Status(CONFIG.job, RUN, 0, step=step, received=ROSTER.bitmap(verified),
                 verified=ROSTER.bitmap(verified), refused=ROSTER.bitmap([]), reasons=(),
                 sent_at=at, failed=failed)  # fmt: skip
    return msg, inline_lists(msg)


def _result(step: str | None, at: int, peers: tuple[str, ...] = (A, B)) -> tuple[Result, PeerLists]:
    msg = Result(CONFIG.job, RUN, 0, step=step, cid=str(CID.hash(RAW, str(step).encode())),
                 record=str(record_cid(str(step))), method="mean", peers=ROSTER.bitmap(peers),
                 sent_at=at)  # fmt: skip
    return msg, inline_lists(msg)


def test_a_steps_result_leaves_the_round_open_for_the_other_steps() -> None:
    view = _view()
    view.see_status(*_status("head", 10))
    view.see_status(*_status("embed", 10))
    view.see_result(*_result("head", 20, (A,)))
    assert view.standing(0, A, 0, "head") == (Standing.VERIFIED, None)
    assert view.standing(0, B, 0, "head") == (
        Standing.OVER,
        "step 'head' of round 0 closed without this peer's input",
    )
    assert view.standing(0, B, 0, "embed") == (Standing.UNKNOWN, None)  # still open
    assert view.current is not None and view.current.open_round == 0
    assert not view.outcome(0, 0).known and not view.outcome(0, 0, "embed").known


def test_the_rounds_failure_and_close_reach_every_step() -> None:
    view = _view()
    view.see_status(*_status("body", 10, verified=(A,)))
    view.see_status(*_status(None, 20, failed="every step failed"))
    assert view.standing(0, B, 0, "embed") == (
        Standing.FAILED,
        "round 0 failed: every step failed",
    )
    assert view.outcome(0, 0, "embed").failed == "round 0 failed: every step failed"
    closed = _view()
    closed.see_result(*_result(None, 30))
    assert closed.standing(0, A, 0, "embed") == (
        Standing.OVER,
        "round 0 closed without this peer's input to step 'embed' of round 0",
    )


def test_a_round_whose_every_step_failed_has_failed() -> None:
    view = _view()
    for i, step in enumerate(STEPS):
        assert not view.outcome(0, 0).known
        view.see_status(*_status(step, 10 + i, failed=f"{step} quorum"))
    assert view.outcome(0, 0).failed == (
        "every step failed (step 'head': head quorum; step 'body': body quorum; "
        "step 'embed': embed quorum)"
    )


def test_steps_end_in_the_order_they_were_heard_and_a_failed_round_ends_the_rest() -> None:
    view = _view()
    view.see_result(*_result("embed", 10))
    view.see_status(*_status("head", 11, failed="late"))
    view.see_result(*_result("embed", 12))  # the beacon's repeat moves nothing
    assert [(s, o.failed) for s, o in view.steps_ended(0)] == [("embed", None), ("head", "late")]
    view.see_status(*_status(None, 13, failed="stopped"))
    assert [(s, o.failed) for s, o in view.steps_ended(0)] == [
        ("embed", None),
        ("head", "late"),
        ("body", "round 0 failed: stopped"),
    ]
    # only what was stamped at ``since_ms`` or later counts: head's own failure was not
    assert [(s, o.failed) for s, o in view.steps_ended(0, since_ms=12)] == [
        ("embed", None),
        ("head", "round 0 failed: stopped"),
        ("body", "round 0 failed: stopped"),
    ]


def test_messages_about_a_step_the_job_does_not_have_change_nothing() -> None:
    view = _view()
    assert not view.knows("tail") and view.knows("head") and view.knows(None)
    view.see_status(*_status("tail", 10, failed="x"))
    view.see_result(*_result("tail", 11))
    assert view.current is None and view.runs == {}
    plain = CoordinatorView(ROSTER)  # a job without steps: any step is another job's
    assert not plain.knows("all") and plain.knows(None)
