"""Activation messages: signed, bound to job, run, round, micro-batch, stage and replica; a
stage refuses a CID from a peer not in the stage before it (forward) or after it (backward),
another lane's replica, replays and forgeries, each with its typed reason."""

from __future__ import annotations

from typing import Any

import pytest

from gradstore.errors import MessageError, Reason
from gradstore.pipeline import BACKWARD, FORWARD, decode_stage_message, verify_stage_message

from .helpers import BODY, HEAD, KEYS, RUN, job, message

PIPE = job().pipeline
assert PIPE is not None


def _verify(data: bytes, **over: Any) -> Any:
    args: dict[str, Any] = dict(
        job="pipe-test",
        run=RUN,
        round_=0,
        stage="head",
        replica=0,
        direction=FORWARD,
        pipeline=PIPE,
    )
    args.update(over)
    return verify_stage_message(data, **args)


def test_the_lanes_neighbours_are_accepted_both_ways() -> None:
    got = _verify(message(BODY[0], micro_batch=3))
    assert (got.sender, got.micro_batch, got.stage) == (BODY[0], 3, "head")
    back = message(HEAD[1], type_=BACKWARD, stage="body", replica=1)
    assert _verify(back, stage="body", replica=1, direction=BACKWARD).sender == HEAD[1]


@pytest.mark.parametrize(
    ("data", "over", "reason"),
    [
        # a peer not in the stage before (a head replica, an outsider) sending activations
        (lambda: message(HEAD[1]), {}, Reason.NOT_IN_STEP),
        (lambda: message(KEYS[4].did), {}, Reason.NOT_IN_STEP),
        # not in the stage after, sending gradients back
        (
            lambda: message(BODY[1], type_=BACKWARD, stage="body"),
            {"stage": "body", "direction": BACKWARD},
            Reason.NOT_IN_STEP,
        ),
        # the other lane's replica
        (lambda: message(BODY[1]), {}, Reason.WRONG_PEER),
        # replays: another run, round, stage or replica
        (lambda: message(BODY[0], run="otherrun01"), {}, Reason.WRONG_RUN),
        (lambda: message(BODY[0], round_=0), {"round_": 1}, Reason.STALE_ROUND),
        (lambda: message(BODY[0], round_=2), {"round_": 1}, Reason.FUTURE_ROUND),
        (lambda: message(BODY[0], micro_batch=4), {}, Reason.OUT_OF_RANGE),
        (lambda: message(BODY[1], replica=1), {}, Reason.UNKNOWN_STEP),
        (lambda: message(BODY[0], job_name="other"), {}, Reason.WRONG_JOB),
        # a gradient where an activation is due, and a first stage that takes none
        (lambda: message(HEAD[0], type_=BACKWARD), {}, Reason.UNEXPECTED_TYPE),
        (lambda: message(BODY[0], stage="body"), {"stage": "body"}, Reason.UNEXPECTED_TYPE),
    ],
)
def test_a_stage_refuses_with_a_typed_reason(data, over, reason) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MessageError) as err:
        _verify(data(), **over)
    assert err.value.code is reason


def test_forgeries_are_refused() -> None:
    good = bytearray(message(BODY[0], micro_batch=1))
    i = good.index(b"\x01", good.index(b"micro_batch"))
    forged = bytes(good[:i]) + b"\x02" + bytes(good[i + 1 :])  # micro-batch 1 -> 2
    with pytest.raises(MessageError) as err:
        decode_stage_message(forged)
    assert err.value.code is Reason.BAD_SIGNATURE
    with pytest.raises(MessageError) as err:
        decode_stage_message(bytes(good) + b"\x00" * 5000)
    assert err.value.code is Reason.TOO_LARGE
    with pytest.raises(MessageError) as err:
        decode_stage_message(b"\x81\xa1v\x01")
    assert err.value.code is Reason.MALFORMED
