"""The decisions of a coordinator in a job split among coordinators by steps, without a
network (docs/design/multicoord.md): it ignores announcements for steps it does not own,
the root fails another owner's silent step at its deadline plus the close retries, naming
the owner, and signed statuses and results are checked against their step's owner."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gradstore.coordinator import CoordinatorState, Verdict
from gradstore.coordinator.journal import RoundRow
from gradstore.coordinator.state import FailStep
from gradstore.errors import MessageError, Reason
from gradstore.job import parse_job
from gradstore.messages import Announce, Status, encode_message, verify_message

from .harness import key

RUN = "a" * 26
CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
ROOT, OWNER = key(100), key(101)
PEERS = sorted((key(i) for i in range(2)), key=lambda k: k.did)
CONFIG = parse_job(
    {
        "job": "test-job",
        "coordinator": ROOT.did,
        "peers": [k.did for k in PEERS],
        "rounds": {"count": 1, "quorum": 2, "deadline_s": 30.0},
        "steps": [
            {"name": "head", "tensors": ["fc.*"], "deadline_s": 10.0, "coordinator": OWNER.did},
            {"name": "body", "tensors": ["conv.*"]},
        ],
    }
)


def state(owner: str, grace: float = 5.0) -> CoordinatorState:
    s = CoordinatorState(CONFIG, owner=owner, remote_grace_s=grace)
    s.run_id = RUN
    return s


def announcement(step: str, now: float, i: int = 0) -> bytes:
    ann = Announce(
        job=CONFIG.job,
        run=RUN,
        round=0,
        step=step,
        peer=PEERS[i].did,
        cid=CID,
        num_samples=1,
        sent_at=int(now * 1000),
    )
    return encode_message(ann, PEERS[i])


def test_a_coordinator_ignores_announcements_for_steps_it_does_not_own() -> None:
    now = time.time()
    root, owner = state(ROOT.did), state(OWNER.did)
    for s in (root, owner):
        s.opened(RoundRow(0, now, "open", None, None, None, False), (), now)
    verdict, effects = root.admit(announcement("head", now), now)
    assert verdict is Verdict.IGNORE and not effects.writes and not effects.statuses
    assert not root.refusals and root.book(0, "head") is None  # no refusal, no book
    assert root.remote_clock == {0: now}  # but the root's clock of the round started
    assert owner.admit(announcement("head", now), now)[0] is Verdict.ACCEPT
    assert owner.admit(announcement("body", now), now)[0] is Verdict.IGNORE
    assert root.admit(announcement("body", now), now)[0] is Verdict.ACCEPT
    # a step the job lacks is still told as such, whoever hears it
    verdict, _ = owner.admit(announcement("tail", now, 1), now)
    assert verdict is Verdict.REFUSE and owner.refusals[Reason.UNKNOWN_STEP] == 1


def test_the_root_fails_a_silent_owners_step_at_its_deadline_plus_the_close_retries() -> None:
    now = time.time()
    root = state(ROOT.did, grace=5.0)
    root.opened(RoundRow(0, now, "open", None, None, None, False), (), now)
    assert root.remote_due(now) == ([], None)  # the round's clock has not started
    root.admit(announcement("head", now), now)
    assert root.remote_due(now + 14.9) == ([], now + 15.0)  # head's 10 s, then 5 s of retries
    over, _ = root.remote_due(now + 15.0)
    assert over == [("head", f"unavailable: no result from its coordinator {OWNER.did}")]
    effects = root.remote_failed(0, "head", over[0][1])
    assert effects.writes == [FailStep(0, "head", over[0][1])]
    assert not root.round_done(0)  # its own step is still open
    assert not root.wants_remote(0, "head") and root.remote_due(now + 20) == ([], None)
    # an owner that is not the root waits on no one
    owner = state(OWNER.did)
    owner.opened(RoundRow(0, now, "open", None, None, None, False), (), now)
    owner.admit(announcement("body", now), now)
    assert owner.remote_due(now + 100) == ([], None) and owner.steps.ends == ("head",)


def _status(step: str | None, signer: Any) -> bytes:
    return encode_message(
        Status(
            job=CONFIG.job,
            run=RUN,
            round=0,
            step=step,
            received=b"",
            verified=b"",
            refused=b"",
            reasons=(),
            sent_at=int(time.time() * 1000),
        ),
        signer,
    )


def test_a_status_of_a_step_is_checked_against_its_owner_else_the_root() -> None:
    owners: dict[str, Any] = {"job": CONFIG.job, "coordinator": ROOT.did}
    owners["owners"] = CONFIG.step_owners
    assert verify_message(_status("head", OWNER), **owners).step == "head"
    assert verify_message(_status("body", ROOT), **owners).step == "body"
    assert verify_message(_status(None, ROOT), **owners).step is None
    for data in (_status("head", ROOT), _status("body", OWNER), _status(None, OWNER)):
        with pytest.raises(MessageError) as refused:
            verify_message(data, **owners)
        assert refused.value.code is Reason.NOT_COORDINATOR
    with pytest.raises(MessageError):  # without the owners, only the root signs
        verify_message(_status("head", OWNER), job=CONFIG.job, coordinator=ROOT.did)
