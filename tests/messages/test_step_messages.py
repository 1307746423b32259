"""Steps on the wire (issue 19): announcements, statuses and results name their step, the
signatures and the lists block cover it, and a message without a step is today's, byte for byte.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from gradstore.dag import CarReader
from gradstore.dag.cid import CID, DAG_CBOR
from gradstore.messages import (
    INLINE_BYTES,
    MAX_MESSAGE_BYTES,
    Announce,
    MessageError,
    Result,
    Roster,
    SigningKey,
    Status,
    announcement_signature,
    announcement_signed,
    decode_lists,
    decode_message,
    decode_record,
    did_from_public_key,
    encode_fitted,
    encode_message,
    verify_message,
)

from .conftest import raw_cid, record_cid, seeded_key

JOB = "mnist-demo"
RUN = "k3x9run0000000000000000000"
GRAD = str(raw_cid(b"gradient"))
AGG = str(raw_cid(b"aggregate"))
REC = str(record_cid(b"record"))
VECTORS = Path(__file__).resolve().parents[1] / "vectors"

#: Bytes that main (before steps existed) encoded for the messages below.
MAIN_ANNOUNCE = (
    "8aa17602a474797065a8616e6e6f756e6365a36a6f62aa6d6e6973742d64656d6fa372756eba6b337839"
    "72756e30303030303030303030303030303030303030a5726f756e6403a470656572d9386469643a6b65"
    "793a7a364d6b6a63686866557344366d6d766e69386d436458487732313658726d39625165326d424831"
    "503552446a564a47a3636964d93b6261666b72656961336e6932656834796b726c6f6172716a6573646b"
    "33636c6636746b637a623577686e6e7a3263786733686c6569623233347971ab6e756d5f73616d706c65"
    "73cd0258a773656e745f6174cf0000018bcfe56800a3736967c440263b7246a8ebd82c4a51c42fcf8a79"
    "dd9257737270da29d0a9cff27431bd86d7fe65b777d4c9a20ffb03440020898922ba5807917b13c028fb"
    "4be4344c46e402"
)
MAIN_STATUS = (
    "8ca17602a474797065a6737461747573a36a6f62aa6d6e6973742d64656d6fa372756eba6b3378397275"
    "6e30303030303030303030303030303030303030a5726f756e6403a87265636569766564c401c0a87665"
    "726966696564c40180a772656675736564c40140a7726561736f6e7391a9616273656e743a2078a77365"
    "6e745f617405a66661696c6564a671756f72756da3736967c440aa8b2930e2979fb0264cdaedb17b81ce"
    "a49cc9dca7fac784c89c6a1d58fb67572634bc58283f02aa5986d75fd2d686e91f38da2c6cf5b0d73ddf"
    "bc01e9a2a609"
)
MAIN_RESULT = (
    "8ba17602a474797065a6726573756c74a36a6f62aa6d6e6973742d64656d6fa372756eba6b3378397275"
    "6e30303030303030303030303030303030303030a5726f756e6403a3636964d93b6261666b726569686f"
    "687273336c7237753375686c35776637617274736c7974743470786f327064686f3279676d363435356e"
    "7364663577643569a67265636f7264d93b6261667972656964717a326472376372356836326574706234"
    "686c68676b72366f36617737793568373473677a636a6a737534736c377737667865a66d6574686f64a6"
    "666564617667a57065657273c40180a773656e745f617407a3736967c4403f96335cf990dd8dc40af305"
    "7f4b1f0985e27e69006d291a2dd66efa7f3cffd0a2b8a67bb4ec6ba200cb0fc3f3cfcf247b422cd370ff"
    "d8c759f7996315c9640a"
)
#: SHA-256 of the fitted status main wrote for 1,000 refused peers, and its lists block.
MAIN_FITTED = "9000d9938695f32d9ce721a3e55b92e8de19cf771a8309cfbde0304b057577c7"
MAIN_FITTED_BLOCK = "bafyreibi3zmy5i62snjmai3y6degyyd637l77ssmxptrltz7eqnejv4n74"

HOSTILE_STEPS: list[Any] = ["../../x", "", "a" * 65, ".hidden", "a b", "é", 7, b"step", ["x"]]


def _roster(n: int) -> Roster:
    return Roster(seeded_key(i).did for i in range(1, n + 1))


ROSTER = _roster(3)


def _announce(key: SigningKey, **kw: Any) -> Announce:
    fields: dict[str, Any] = dict(
        job=JOB,
        run=RUN,
        round=3,
        peer=key.did,
        cid=GRAD,
        num_samples=600,
        sent_at=1_700_000_000_000,
    )
    fields.update(kw)
    return Announce(**fields)


def _status(roster: Roster = ROSTER, **kw: Any) -> Status:
    a, b = seeded_key(1).did, seeded_key(2).did
    fields: dict[str, Any] = dict(
        job=JOB,
        run=RUN,
        round=3,
        received=roster.bitmap([a, b]),
        verified=roster.bitmap([a]),
        refused=roster.bitmap([b]),
        reasons=("absent: x",),
        sent_at=5,
        failed="quorum",
    )
    fields.update(kw)
    return Status(**fields)


def _result(roster: Roster = ROSTER, **kw: Any) -> Result:
    fields: dict[str, Any] = dict(
        job=JOB,
        run=RUN,
        round=3,
        cid=AGG,
        record=REC,
        method="fedavg",
        peers=roster.bitmap([seeded_key(1).did]),
        sent_at=7,
    )
    fields.update(kw)
    return Result(**fields)


def _keys(data: bytes) -> list[str]:
    return [k for k, _ in msgpack.unpackb(data, object_pairs_hook=list)]


def _craft(pairs: list[tuple[str, Any]], key: SigningKey) -> bytes:
    """Sign an arbitrary map the way a (possibly hostile) sender would: sig over the rest."""
    body = msgpack.packb(dict(pairs), use_bin_type=True)
    return msgpack.packb({**dict(pairs), "sig": key.sign(body)}, use_bin_type=True)


# --- without a step, today's bytes --------------------------------------------------------


def test_messages_without_a_step_are_the_bytes_main_wrote(
    peer_key: SigningKey, coord_key: SigningKey
) -> None:
    ann = encode_message(_announce(peer_key), peer_key)
    status = encode_message(_status(), coord_key)
    result = encode_message(_result(), coord_key)
    assert (ann.hex(), status.hex(), result.hex()) == (MAIN_ANNOUNCE, MAIN_STATUS, MAIN_RESULT)
    for data in (ann, status, result):
        assert "step" not in _keys(data)
        assert encode_message(decode_message(data), peer_key if data is ann else coord_key) == data


def test_a_fitted_status_without_a_step_and_its_lists_block_are_the_bytes_main_wrote(
    coord_key: SigningKey,
) -> None:
    big = _roster(1000)
    status = Status(
        job=JOB,
        run=RUN,
        round=3,
        received=big.bitmap(big.peers),
        verified=bytes(125),
        refused=big.bitmap(big.peers),
        reasons=tuple("absent: " + "x" * 200 for _ in big.peers),
        sent_at=5,
    )
    data, block = encode_fitted(status, coord_key)
    assert block is not None
    assert hashlib.sha256(data).hexdigest() == MAIN_FITTED
    assert str(block[0]) == MAIN_FITTED_BLOCK


def _vector_record(name: str) -> tuple[Any, ...]:
    reader = CarReader()
    blocks = reader.feed((VECTORS / name).read_bytes())
    assert reader.roots is not None
    root = reader.roots[0]
    data = next(bytes(b.data) for b in blocks if b.cid == root)
    return decode_record(data, cid=root), root


def test_the_vectors_peer_signatures_still_verify() -> None:
    """Round/4 vectors carry announcements that main signed: the rebuilt bytes are the same."""
    vectors = json.loads((VECTORS / "vectors.json").read_text("utf-8"))["vectors"]
    signed = [v for v in vectors if v["record_type"] == "gradstore/round/4"]
    assert len(signed) >= 10
    for vector in signed:
        record, _ = _vector_record(vector["car"])
        assert record.step is None
        assert all(i.peer_signed(record) for i in record.inputs), vector["name"]


# --- with a step ----------------------------------------------------------------------------


def test_a_step_is_on_the_wire_after_round_and_round_trips(
    peer_key: SigningKey, coord_key: SigningKey
) -> None:
    ann = _announce(peer_key, step="layer4")
    data = encode_message(ann, peer_key)
    assert _keys(data)[:6] == ["v", "type", "job", "run", "round", "step"]
    assert verify_message(data, job=JOB, coordinator=coord_key.did, peers=ROSTER) == ann
    msg, signature = announcement_signature(data)
    assert msg == ann and msg.step == "layer4" and len(signature) == 64
    for m in (_status(step="layer4"), _result(step="layer4")):
        wire = encode_message(m, coord_key)
        assert _keys(wire)[5] == "step"
        assert verify_message(wire, job=JOB, coordinator=coord_key.did, peers=ROSTER) == m


def test_the_peer_signature_covers_the_step(peer_key: SigningKey, coord_key: SigningKey) -> None:
    """A coordinator (or anyone) cannot move a peer's gradient to another step."""
    data = encode_message(_announce(peer_key, step="layer4"), peer_key)
    moved = data.replace(b"layer4", b"layer3")
    with pytest.raises(MessageError) as info:
        verify_message(moved, job=JOB, coordinator=coord_key.did)
    assert info.value.reason == "bad-signature"
    # nor drop it: the same announcement without the step is not what the peer signed
    _, signature = announcement_signature(data)
    assert announcement_signed(_announce(peer_key, step="layer4"), signature)
    assert not announcement_signed(_announce(peer_key), signature)
    assert not announcement_signed(_announce(peer_key, step="layer3"), signature)


@pytest.mark.parametrize("bad", HOSTILE_STEPS)
def test_a_step_name_is_checked_like_a_job_name(
    peer_key: SigningKey, coord_key: SigningKey, bad: Any
) -> None:
    for build in (
        lambda: _announce(peer_key, step=bad),
        lambda: _status(step=bad),
        lambda: _result(step=bad),
    ):
        with pytest.raises(MessageError) as info:
            build()
        assert info.value.reason == "malformed"
    # and a hostile sender that writes the bytes itself is refused the same way
    pairs = [(k, v) for k, v in msgpack.unpackb(
        encode_message(_announce(peer_key, step="ok"), peer_key), object_pairs_hook=list
    ) if k != "sig"]  # fmt: skip
    pairs[5] = ("step", bad)
    with pytest.raises(MessageError) as info:
        verify_message(_craft(pairs, peer_key), job=JOB, coordinator=coord_key.did)
    assert info.value.reason == "malformed"


def test_a_nil_step_is_refused_rather_than_read_as_no_step(peer_key: SigningKey) -> None:
    pairs = [(k, v) for k, v in msgpack.unpackb(
        encode_message(_announce(peer_key, step="ok"), peer_key), object_pairs_hook=list
    ) if k != "sig"]  # fmt: skip
    pairs[5] = ("step", None)
    with pytest.raises(MessageError, match="nil") as info:
        decode_message(_craft(pairs, peer_key))
    assert info.value.reason == "malformed"


def test_a_step_in_another_place_is_refused(peer_key: SigningKey) -> None:
    pairs = [(k, v) for k, v in msgpack.unpackb(
        encode_message(_announce(peer_key, step="ok"), peer_key), object_pairs_hook=list
    ) if k != "sig"]  # fmt: skip
    pairs.append(pairs.pop(5))  # step last: not the wire order
    with pytest.raises(MessageError, match="keys") as info:
        decode_message(_craft(pairs, peer_key))
    assert info.value.reason == "malformed"


# --- the lists block is the step's ------------------------------------------------------


STEPS = [f"layer{i:02d}" for i in range(64)]


def test_every_step_status_and_result_fits_at_1000_peers_and_64_steps(
    coord_key: SigningKey,
) -> None:
    """The worst case: 1,000 peers, every one refused with a full-length reason, in each of
    64 steps; each step's status moves its lists to a block, its result stays inline."""
    roster = _roster(1000)
    everyone = roster.bitmap(roster.peers)
    reasons = tuple(f"absent: {'x' * 292}" for _ in roster.peers)  # 300 bytes, the longest
    blocks = set()
    for step in STEPS:
        status = Status(
            job=JOB,
            run=RUN,
            round=3,
            step=step,
            received=everyone,
            verified=bytes(roster.nbytes),
            refused=everyone,
            reasons=reasons,
            sent_at=5,
            failed="deadline: quorum not met " + "y" * 200,
        )
        data, block = encode_fitted(status, coord_key)
        assert block is not None and len(data) <= INLINE_BYTES <= MAX_MESSAGE_BYTES
        sent = verify_message(data, job=JOB, coordinator=coord_key.did, peers=roster)
        assert isinstance(sent, Status) and sent.step == step and sent.lists == str(block[0])
        lists = decode_lists(block[1], sent, roster)
        assert lists.reasons == reasons and lists.refused == everyone
        blocks.add(block[0])
        result = Result(
            job=JOB,
            run=RUN,
            round=3,
            step=step,
            cid=AGG,
            record=REC,
            method="multikrum",
            peers=everyone,
            sent_at=6,
        )
        data, block = encode_fitted(result, coord_key)
        assert block is None and len(data) <= INLINE_BYTES
        assert verify_message(data, job=JOB, coordinator=coord_key.did, peers=roster) == result
    assert len(blocks) == len(STEPS)  # one block per step: the step is in each


@pytest.fixture(scope="module")
def huge_roster() -> Roster:
    """A roster whose result bitmap alone is longer than INLINE_BYTES (132,000 peers)."""
    return Roster(
        did_from_public_key(hashlib.sha256(i.to_bytes(4, "big")).digest()) for i in range(132_000)
    )


def _fitted(msg: Status | Result, coord_key: SigningKey) -> tuple[Status | Result, bytes]:
    data, block = encode_fitted(msg, coord_key)
    assert block is not None
    sent = decode_message(data)
    assert isinstance(sent, Status | Result)
    return sent, block[1]


def _big_status(roster: Roster, step: str | None) -> Status:
    everyone = roster.bitmap(roster.peers)
    return Status(
        job=JOB,
        run=RUN,
        round=3,
        step=step,
        received=everyone,
        verified=bytes(roster.nbytes),
        refused=everyone,
        reasons=tuple(f"absent: {'x' * 200}" for _ in roster.peers),
        sent_at=5,
    )


def _big_result(roster: Roster, step: str | None) -> Result:
    return Result(
        job=JOB,
        run=RUN,
        round=3,
        step=step,
        cid=AGG,
        record=REC,
        method="mean",
        peers=roster.bitmap(roster.peers),
        sent_at=5,
    )


@pytest.mark.parametrize("kind", ["status", "result"])
def test_a_lists_block_of_another_step_is_refused(
    coord_key: SigningKey, kind: str, huge_roster: Roster
) -> None:
    """A coordinator's message for one step that links another step's (or no step's) block:
    the block is the one its CID names, but it holds another step's lists."""
    roster = _roster(1000) if kind == "status" else huge_roster
    build = _big_status if kind == "status" else _big_result
    sent = {step: _fitted(build(roster, step), coord_key) for step in ("a", "b", None)}
    for step, (msg, block) in sent.items():
        own = decode_lists(block, msg, roster)  # its own block reads
        assert (own.refused if kind == "status" else own.peers) == roster.bitmap(roster.peers)
        for other, (_, foreign) in sent.items():
            if other != step:
                relinked = dataclasses.replace(msg, lists=str(CID.hash(DAG_CBOR, foreign)))
                with pytest.raises(MessageError) as info:
                    decode_lists(foreign, relinked, roster)
                assert info.value.reason == "malformed", (step, other)
