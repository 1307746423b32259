"""A status's optional ``deadline`` (issue 24, item 2): when the open round's deadline falls,
signed by the coordinator, so a waiting peer can show it. Right after ``sent_at`` on the
wire, covered by the signature, and off the wire when None (the bytes of a status without
it are main's: ``test_step_messages`` pins them)."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest

from gradstore.messages import (
    MessageError,
    Roster,
    SigningKey,
    Status,
    decode_message,
    encode_fitted,
    encode_message,
    verify_message,
)

from .conftest import seeded_key

JOB = "mnist-demo"
RUN = "k3x9run0000000000000000000"
DEADLINE = 1_700_000_060_000


def _status(roster: Roster, **kw: Any) -> Status:
    a = seeded_key(1).did
    fields: dict[str, Any] = dict(
        job=JOB,
        run=RUN,
        round=3,
        received=roster.bitmap([a]),
        verified=roster.bitmap([a]),
        refused=roster.bitmap([]),
        reasons=(),
        sent_at=1_700_000_000_000,
    )
    fields.update(kw)
    return Status(**fields)


def _pairs(data: bytes) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in msgpack.unpackb(data, object_pairs_hook=list) if k != "sig"]


def _craft(pairs: list[tuple[str, Any]], key: SigningKey) -> bytes:
    body = msgpack.packb(dict(pairs), use_bin_type=True)
    return msgpack.packb({**dict(pairs), "sig": key.sign(body)}, use_bin_type=True)


@pytest.fixture
def roster() -> Roster:
    return Roster([seeded_key(i).did for i in (1, 2)])


@pytest.fixture
def coord() -> SigningKey:
    return seeded_key(9)


def test_a_deadline_is_on_the_wire_after_sent_at_and_round_trips(
    roster: Roster, coord: SigningKey
) -> None:
    status = _status(roster, deadline=DEADLINE, step="head")
    data = encode_message(status, coord)
    keys = [k for k, _ in _pairs(data)]
    assert keys[keys.index("sent_at") + 1] == "deadline"
    assert verify_message(data, job=JOB, coordinator=coord.did, peers=roster) == status
    # without it, it is not on the wire at all (never nil)
    assert "deadline" not in [k for k, _ in _pairs(encode_message(_status(roster), coord))]


def test_the_signature_covers_the_deadline(roster: Roster, coord: SigningKey) -> None:
    data = encode_message(_status(roster, deadline=DEADLINE), coord)
    moved = data.replace(DEADLINE.to_bytes(8, "big"), (DEADLINE + 1).to_bytes(8, "big"))
    assert moved != data
    with pytest.raises(MessageError) as info:
        verify_message(moved, job=JOB, coordinator=coord.did, peers=roster)
    assert info.value.reason == "not-coordinator"  # not the coordinator's signature


@pytest.mark.parametrize("bad", [None, -1, "soon", 1.5, True])
def test_a_deadline_that_is_not_a_uint_is_refused(
    roster: Roster, coord: SigningKey, bad: Any
) -> None:
    pairs = _pairs(encode_message(_status(roster, deadline=DEADLINE), coord))
    pairs = [(k, bad if k == "deadline" else v) for k, v in pairs]
    with pytest.raises(MessageError) as info:
        decode_message(_craft(pairs, coord))
    assert info.value.reason == "malformed"
    for wrong in (bad, 2**64):
        if wrong is not None:
            with pytest.raises(MessageError):
                _status(roster, deadline=wrong)


def test_a_deadline_in_another_place_is_refused(roster: Roster, coord: SigningKey) -> None:
    pairs = _pairs(encode_message(_status(roster, deadline=DEADLINE), coord))
    at = [k for k, _ in pairs].index("deadline")
    pairs.insert(at - 1, pairs.pop(at))  # before sent_at: not the wire order
    with pytest.raises(MessageError, match="keys") as info:
        decode_message(_craft(pairs, coord))
    assert info.value.reason == "malformed"


def test_a_status_whose_lists_move_to_a_block_keeps_its_deadline(coord: SigningKey) -> None:
    big = Roster([seeded_key(i).did for i in range(1, 1001)])
    status = dataclasses.replace(
        _status(big, deadline=DEADLINE),
        refused=big.bitmap(big.peers),
        reasons=tuple("absent: " + "x" * 200 for _ in big.peers),
    )
    data, block = encode_fitted(status, coord)
    assert block is not None
    decoded = decode_message(data)
    assert isinstance(decoded, Status) and decoded.lists is not None
    assert decoded.deadline == DEADLINE
