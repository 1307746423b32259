"""Activation messages: signed, bound to job, run, round, micro-batch, stage and replica; a
stage refuses a CID from a peer not in the stage before it (forward) or after it (backward),
another lane's replica, replays and forgeries, each with its typed reason."""

from __future__ import annotations

from typing import Any

import pytest

from gradstore.errors import MessageError, Reason
from gradstore.messages.wire import pack_map, unpack_map
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


def _resigned(change: Any) -> bytes:
    """A body replica's message with its pairs changed by ``change`` and signed again."""
    pairs = [p for p in unpack_map(message(BODY[0])) if p[0] != "sig"]
    pairs = change(pairs)
    return pack_map([*pairs, ("sig", KEYS[0].sign(pack_map(pairs)))])


def _set(key: str, value: Any) -> Any:
    return lambda pairs: [(k, value if k == key else v) for k, v in pairs]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (lambda: _resigned(_set("type", "pipeline/other")), Reason.UNKNOWN_TYPE),
        (lambda: _resigned(lambda ps: [p for p in ps if p[0] != "replica"]), Reason.MALFORMED),
        (lambda: _resigned(lambda ps: [*ps, ("extra", 1)]), Reason.MALFORMED),
        (lambda: _resigned(lambda ps: [*ps[2:4], *ps[:2], *ps[4:]]), Reason.MALFORMED),
        (
            lambda: _resigned(lambda ps: [(k, v.upper() if k == "cid" else v) for k, v in ps]),
            Reason.MALFORMED,
        ),
        (lambda: message(BODY[0])[:-1], Reason.MALFORMED),  # a sig of 63 bytes, mis-framed
        (
            lambda: message(BODY[0]).replace(b"\xa5round\x00", b"\xa5round\xcc\x00"),
            Reason.MALFORMED,  # round 0 as a uint8: not canonical msgpack
        ),
    ],
)
def test_a_message_not_in_the_wire_form_is_refused(data, reason) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MessageError) as err:
        decode_stage_message(data())
    assert err.value.code is reason, err.value


def test_a_short_signature_is_malformed() -> None:
    pairs = unpack_map(message(BODY[0]))
    short = pack_map([*pairs[:-1], ("sig", pairs[-1][1][:63])])
    with pytest.raises(MessageError) as err:
        decode_stage_message(short)
    assert err.value.code is Reason.MALFORMED
    assert "`sig` must be 64 bytes" in str(err.value)
