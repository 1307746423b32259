"""Signed announce / result / status messages: round trips, canonical bytes, every refusal."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from gradstore.errors import IntegrityError
from gradstore.messages import (
    INLINE_BYTES,
    MAX_MESSAGE_BYTES,
    Announce,
    MessageError,
    MessageKind,
    Result,
    Roster,
    SigningKey,
    Status,
    decode_lists,
    decode_message,
    encode_fitted,
    encode_message,
    inline_lists,
    verify_message,
)

from .conftest import raw_cid, record_cid, seeded_key

JOB = "mnist-demo"
GRAD = str(raw_cid(b"gradient"))
AGG = str(raw_cid(b"aggregate"))
REC = str(record_cid(b"record"))
RUN = "k3x9run0000000000000000000"
ROSTER = Roster(seeded_key(i).did for i in range(1, 4))


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


def _result(*peers: str, roster: Roster = ROSTER) -> Result:
    return Result(
        job=JOB,
        run=RUN,
        round=3,
        cid=AGG,
        record=REC,
        method="fedavg",
        peers=roster.bitmap(peers),
        sent_at=1_700_000_001_000,
    )


def _status(
    received: tuple[str, ...] = (),
    verified: tuple[str, ...] = (),
    refused: dict[str, str] | None = None,
    *,
    roster: Roster = ROSTER,
    failed: str | None = None,
) -> Status:
    refused = refused or {}
    order = [p for p in roster if p in refused]
    return Status(
        job=JOB,
        run=RUN,
        round=3,
        received=roster.bitmap(received),
        verified=roster.bitmap(verified),
        refused=roster.bitmap(order),
        reasons=tuple(refused[p] for p in order),
        sent_at=5,
        failed=failed,
    )


def _craft(pairs: list[tuple[str, Any]], key: SigningKey) -> bytes:
    """Sign an arbitrary map the way a (possibly hostile) sender would: sig over the rest."""
    body = msgpack.packb(dict(pairs), use_bin_type=True)
    return msgpack.packb({**dict(pairs), "sig": key.sign(body)}, use_bin_type=True)


def _pairs(msg: Announce | Result | Status) -> list[tuple[str, Any]]:
    from dataclasses import fields

    values = [(f.name, getattr(msg, f.name)) for f in fields(msg)]
    return [("v", 2), ("type", msg.kind.value)] + [
        (name, list(v) if isinstance(v, tuple) else v)
        for name, v in values
        if v is not None or name not in ("step", "failed", "lists")  # unset: off the wire
    ]


def _reason(data: bytes, **kw: Any) -> str:
    args: dict[str, Any] = {"job": JOB, "coordinator": seeded_key(100).did}
    args.update(kw)
    with pytest.raises(MessageError) as info:
        verify_message(data, **args)
    return info.value.reason


# --- round trips ---------------------------------------------------------------------------


def test_announce_round_trip(peer_key: SigningKey, coord_key: SigningKey) -> None:
    msg = _announce(peer_key)
    data = encode_message(msg, peer_key)
    assert decode_message(data) == msg
    got = verify_message(data, job=JOB, coordinator=coord_key.did, peers={peer_key.did})
    assert got == msg
    assert got.kind is MessageKind.ANNOUNCE


def test_result_and_status_round_trip(coord_key: SigningKey) -> None:
    a, b = seeded_key(1).did, seeded_key(2).did
    for msg in (_result(a, b), _status((a, b), (a,), {b: "non-finite: tensor 'w' holds NaN"})):
        data = encode_message(msg, coord_key)
        assert verify_message(data, job=JOB, coordinator=coord_key.did, peers=ROSTER) == msg
        assert decode_message(data) == msg


def test_peer_sets_are_bitmaps_over_the_sorted_roster() -> None:
    dids = sorted(seeded_key(i).did for i in range(1, 12))
    roster = Roster(reversed(dids))  # the order a job file lists them in does not matter
    assert roster.peers == tuple(dids) and roster.nbytes == 2
    bitmap = roster.bitmap([dids[0], dids[9]])
    assert bitmap == bytes([0b1000_0000, 0b0100_0000])
    assert roster.members(bitmap) == (dids[0], dids[9])
    assert roster.has(bitmap, dids[9]) and not roster.has(bitmap, dids[1])
    with pytest.raises(ValueError, match="not a peer"):
        roster.bitmap([seeded_key(99).did])


def test_a_failed_status_carries_its_reason_before_the_signature(coord_key: SigningKey) -> None:
    a = seeded_key(1).did
    msg = _status((a,), failed="quorum not met: 1 of 2")
    data = encode_message(msg, coord_key)
    assert verify_message(data, job=JOB, coordinator=coord_key.did) == msg
    keys = [k for k, _ in msgpack.unpackb(data, object_pairs_hook=list)]
    assert keys == [
        "v",
        "type",
        "job",
        "run",
        "round",
        "received",
        "verified",
        "refused",
        "reasons",
        "sent_at",
        "failed",
        "sig",
    ]
    # without a reason there is no `failed` key at all
    plain = encode_message(_status((a,)), coord_key)
    assert "failed" not in dict(msgpack.unpackb(plain, object_pairs_hook=list))


@pytest.mark.parametrize("bad", [None, "", 7, b"quorum"])
def test_a_failed_field_must_be_a_non_empty_string(coord_key: SigningKey, bad: Any) -> None:
    pairs = _pairs(_status(failed="x"))
    i = [k for k, _ in pairs].index("failed")
    pairs[i] = ("failed", bad)
    assert _reason(_craft(pairs, coord_key), coordinator=coord_key.did) == "malformed"
    with pytest.raises(MessageError):
        _status(failed=bad or "")


def test_failed_is_only_a_status_field(coord_key: SigningKey) -> None:
    pairs = _pairs(_result(seeded_key(1).did))
    pairs.append(("failed", "quorum not met"))
    assert _reason(_craft(pairs, coord_key), coordinator=coord_key.did) == "malformed"


def test_wire_layout_is_designs_key_order_with_sig_last(peer_key: SigningKey) -> None:
    data = encode_message(_announce(peer_key), peer_key)
    unpacked = msgpack.unpackb(data, object_pairs_hook=list)
    assert [k for k, _ in unpacked] == [
        "v",
        "type",
        "job",
        "run",
        "round",
        "peer",
        "cid",
        "num_samples",
        "sent_at",
        "sig",
    ]
    assert unpacked[0] == ("v", 2)
    assert unpacked[1] == ("type", "announce")
    # the signature covers exactly the map without "sig"
    body = msgpack.packb(dict(unpacked[:-1]), use_bin_type=True)
    assert peer_key.sign(body) == unpacked[-1][1]


def test_encoding_is_canonical_and_deterministic(peer_key: SigningKey) -> None:
    msg = _announce(peer_key)
    data = encode_message(msg, peer_key)
    assert encode_message(decode_message(data), peer_key) == data
    # smallest encodings: fixmap header, positive fixint for round, uint16 for num_samples
    assert data[0] == 0x8A
    assert b"\xa5round\x03" in data
    assert b"\xabnum_samples\xcd\x02\x58" in data


def test_a_result_names_the_same_peers_whatever_order_they_come_in() -> None:
    a, b, c = (seeded_key(i).did for i in (1, 2, 3))
    assert _result(c, a, b).peers == _result(a, b, c).peers == b"\xe0"


def test_cid_strings_are_normalized_to_base32_v1(peer_key: SigningKey) -> None:
    from multiformats import CID as MFCID

    b58 = MFCID.decode(GRAD).encode("base58btc")
    assert _announce(peer_key, cid=b58).cid == GRAD


def test_construction_refuses_bad_fields(peer_key: SigningKey) -> None:
    a = peer_key.did
    bad: list[dict[str, Any]] = [
        {"job": ""},
        {"round": -1},
        {"round": True},
        {"round": 2**64},
        {"num_samples": 1.5},
        {"peer": "did:key:zzz"},
        {"cid": "not-a-cid"},
        {"run": "short"},
        {"run": "UPPER0CASE0RUN"},
        {"run": "has space in it"},
    ]
    for kw in bad:
        with pytest.raises(MessageError) as info:
            _announce(peer_key, **kw)
        assert info.value.reason == "malformed", kw
    assert a
    with pytest.raises(MessageError, match="dag-cbor"):
        Result(job=JOB, run=RUN, round=0, cid=AGG, record=GRAD, method="sum", peers=b"", sent_at=0)


def test_announce_must_be_signed_by_its_peer(peer_key: SigningKey, other_key: SigningKey) -> None:
    with pytest.raises(MessageError) as info:
        encode_message(_announce(peer_key), other_key)
    assert info.value.reason == "bad-signature"


# --- refusals ------------------------------------------------------------------------------


def test_flipped_signature_byte_is_bad_signature(peer_key: SigningKey) -> None:
    data = bytearray(encode_message(_announce(peer_key), peer_key))
    data[-1] ^= 0x01
    assert _reason(bytes(data)) == "bad-signature"
    with pytest.raises(MessageError, match="bad-signature"):
        decode_message(bytes(data))


def test_flipped_content_byte_is_bad_signature(peer_key: SigningKey) -> None:
    data = encode_message(_announce(peer_key, num_samples=600), peer_key)
    tampered = data.replace(b"\xcd\x02\x58", b"\xcd\x02\x59")  # 600 -> 601 samples
    assert tampered != data
    assert _reason(tampered) == "bad-signature"


def test_announce_signed_by_another_key_is_bad_signature(
    peer_key: SigningKey, other_key: SigningKey
) -> None:
    data = _craft(_pairs(_announce(peer_key)), other_key)
    assert _reason(data) == "bad-signature"


def test_peer_not_in_the_list_is_unknown_peer(peer_key: SigningKey, other_key: SigningKey) -> None:
    data = encode_message(_announce(peer_key), peer_key)
    assert _reason(data, peers=[other_key.did]) == "unknown-peer"
    assert _reason(data, peers=[]) == "unknown-peer"


def test_wrong_job(peer_key: SigningKey, coord_key: SigningKey) -> None:
    assert _reason(encode_message(_announce(peer_key), peer_key), job="other") == "wrong-job"
    assert _reason(encode_message(_result(peer_key.did), coord_key), job="other") == "wrong-job"


@pytest.mark.parametrize("kind", ["result", "status"])
def test_coordinator_messages_signed_by_anyone_else_are_refused(
    kind: str, peer_key: SigningKey, coord_key: SigningKey
) -> None:
    msg: Result | Status = _result(peer_key.did) if kind == "result" else _status((peer_key.did,))
    forged = encode_message(msg, peer_key)  # a peer pretending to be the coordinator
    assert _reason(forged, coordinator=coord_key.did) == "not-coordinator"
    genuine = bytearray(encode_message(msg, coord_key))
    genuine[-5] ^= 0x40
    assert _reason(bytes(genuine), coordinator=coord_key.did) == "not-coordinator"


def test_unknown_type(peer_key: SigningKey) -> None:
    pairs = _pairs(_announce(peer_key))
    pairs[1] = ("type", "gossip")
    assert _reason(_craft(pairs, peer_key)) == "unknown-type"


def test_unsupported_version_is_malformed(peer_key: SigningKey) -> None:
    pairs = _pairs(_announce(peer_key))
    pairs[0] = ("v", 1)  # gradstore's first protocol: no run ids, did lists
    assert _reason(_craft(pairs, peer_key)) == "malformed"


@pytest.mark.parametrize("change", ["extra", "missing", "misordered", "renamed"])
def test_key_set_and_order_are_exact(change: str, peer_key: SigningKey) -> None:
    pairs = _pairs(_announce(peer_key))
    if change == "extra":
        pairs.append(("note", "hi"))
    elif change == "missing":
        del pairs[6]
    elif change == "misordered":
        pairs[2], pairs[3] = pairs[3], pairs[2]
    else:
        pairs[6] = ("CID", pairs[6][1])
    assert _reason(_craft(pairs, peer_key)) == "malformed"


def test_sig_not_last_is_malformed(peer_key: SigningKey) -> None:
    pairs = _pairs(_announce(peer_key))
    body = msgpack.packb(dict(pairs), use_bin_type=True)
    data = msgpack.packb({"sig": peer_key.sign(body), **dict(pairs)}, use_bin_type=True)
    assert _reason(data) == "malformed"


def test_non_minimal_int_is_malformed_even_when_signed(peer_key: SigningKey) -> None:
    data = encode_message(_announce(peer_key, round=3), peer_key)
    body = msgpack.unpackb(data, object_pairs_hook=list)[:-1]
    packed = msgpack.packb(dict(body), use_bin_type=True)
    wide = packed.replace(b"\xa5round\x03", b"\xa5round\xcc\x03")  # uint8 where fixint fits
    assert wide != packed
    # re-frame with a valid signature over the widened bytes: still refused (one encoding only)
    data = wide[:1].replace(b"\x89", b"\x8a") + wide[1:] + b"\xa3sig\xc4\x40" + peer_key.sign(wide)
    assert _reason(data) == "malformed"


def test_string_sent_as_bin_is_malformed(peer_key: SigningKey) -> None:
    pairs = _pairs(_announce(peer_key))
    pairs[2] = ("job", JOB.encode())
    assert _reason(_craft(pairs, peer_key)) == "malformed"


def test_trailing_bytes_are_malformed(peer_key: SigningKey) -> None:
    assert _reason(encode_message(_announce(peer_key), peer_key) + b"\x00") == "malformed"


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x02\x03", b"\x81\x01\x02", b"\xff" * 8])
def test_garbage_is_malformed(data: bytes) -> None:
    assert _reason(data) == "malformed"


def test_oversized_message_is_refused_before_parsing(peer_key: SigningKey) -> None:
    assert _reason(b"\xc1" * (MAX_MESSAGE_BYTES + 1)) == "too-large"
    data = encode_message(_announce(peer_key), peer_key)
    assert _reason(data, max_bytes=len(data) - 1) == "too-large"
    with pytest.raises(MessageError, match="too-large"):
        decode_message(data, max_bytes=len(data) - 1)


def test_bad_cid_string_is_malformed(peer_key: SigningKey) -> None:
    pairs = _pairs(_announce(peer_key))
    pairs[6] = ("cid", "bafynotacid")
    assert _reason(_craft(pairs, peer_key)) == "malformed"


def test_non_canonical_cid_string_is_malformed(peer_key: SigningKey) -> None:
    from multiformats import CID as MFCID

    pairs = _pairs(_announce(peer_key))
    pairs[6] = ("cid", MFCID.decode(GRAD).encode("base58btc"))
    assert _reason(_craft(pairs, peer_key)) == "malformed"


@pytest.mark.parametrize("field", ["peers", "received", "verified", "refused"])
def test_bitmaps_that_do_not_fit_the_roster_are_malformed(
    field: str, coord_key: SigningKey
) -> None:
    a = seeded_key(1).did
    msg: Result | Status = _result(a) if field == "peers" else _status((a,), (a,))
    pairs = _pairs(msg)
    i = [k for k, _ in pairs].index(field)
    for bad in (b"", b"\x80\x00", b"\x81", b"\x1f", [a]):  # short, long, padding bits, a list
        pairs[i] = (field, bad)
        reason = _reason(_craft(pairs, coord_key), coordinator=coord_key.did, peers=ROSTER)
        assert reason == "malformed", bad


def test_a_reason_per_refused_peer(coord_key: SigningKey) -> None:
    a, b = seeded_key(1).did, seeded_key(2).did
    pairs = _pairs(_status((a, b), refused={a: "too-large: 3 MB", b: "stale-round"}))
    i = [k for k, _ in pairs].index("reasons")
    for bad in (["too-large"], ["a", "b", "c"], ["", "x"], ["x" * 301, "y"], [1, 2]):
        pairs[i] = ("reasons", bad)
        reason = _reason(_craft(pairs, coord_key), coordinator=coord_key.did, peers=ROSTER)
        assert reason == "malformed", bad


def test_messages_fit_at_any_number_of_peers(coord_key: SigningKey) -> None:
    # 20,000 peers, each with a long refusal: the lists move to a block, the message stays
    # small, and the block (verified against the CID the signed message carries) holds them.
    dids = [f"did:key:z6Mk{i:044d}" for i in range(20_000)]
    roster = Roster(dids)
    reasons = {d: f"too-large: declares {i} bytes, " + "x" * 250 for i, d in enumerate(dids)}
    big = Status(
        job=JOB,
        run=RUN,
        round=3,
        received=roster.bitmap(dids),
        verified=roster.bitmap(()),
        refused=roster.bitmap(dids),
        reasons=tuple(reasons[d] for d in roster),
        sent_at=5,
    )
    data, block = encode_fitted(big, coord_key)
    assert len(data) <= INLINE_BYTES and block is not None
    linked = verify_message(data, job=JOB, coordinator=coord_key.did, peers=roster)
    assert isinstance(linked, Status) and linked.lists == str(block[0])
    lists = decode_lists(block[1], linked, roster)
    assert lists.received == big.received and lists.refused == big.refused
    assert all(r.startswith("too-large") for r in lists.reasons)  # shortened to fit
    with pytest.raises(IntegrityError):
        decode_lists(block[1][:-1] + bytes([block[1][-1] ^ 1]), linked, roster)
    result = _result(*dids, roster=roster)
    data, block = encode_fitted(result, coord_key)
    assert len(data) > INLINE_BYTES or block is None  # 2.5 kB of bitmap still fits inline
    assert verify_message(data, job=JOB, coordinator=coord_key.did, peers=roster) == result
    small = _status((seeded_key(1).did,))
    data, block = encode_fitted(small, coord_key)
    assert block is None and inline_lists(small).received == small.received


def test_short_signature_is_malformed(peer_key: SigningKey) -> None:
    pairs = _pairs(_announce(peer_key))
    data = msgpack.packb({**dict(pairs), "sig": b"\x00" * 63}, use_bin_type=True)
    assert _reason(data) == "malformed"


def test_the_fast_cid_check_agrees_with_a_full_parse() -> None:
    import os
    import random

    from gradstore.dag.cid import CID as GCID
    from gradstore.messages.schema import check_cid

    rng = random.Random(5)
    for codec in (0x55, 0x70, 0x71):
        for _ in range(200):
            text = str(GCID.hash(codec, os.urandom(8)))
            assert check_cid("cid", text) == text == str(GCID.parse(text))
            # the same bytes with a padding bit set: another string for the same CID
            last = "abcdefghijklmnopqrstuvwxyz234567".index(text[-1])
            padded = text[:-1] + "abcdefghijklmnopqrstuvwxyz234567"[last | 1]
            if padded != text:  # another string for the same bytes: refused, built or received
                with pytest.raises(MessageError, match="malformed"):
                    check_cid("cid", padded)
                pairs = _pairs(_announce(seeded_key(1), cid=text))
                pairs[6] = ("cid", padded)
                assert _reason(_craft(pairs, seeded_key(1))) == "malformed"
            flipped = list(text)
            flipped[rng.randrange(1, len(text))] = rng.choice("ABC0189=")
            try:  # refused, or normalised to its canonical string: never taken as it is
                normal = check_cid("cid", "".join(flipped))
            except MessageError:
                continue
            assert normal == str(GCID.parse(normal)) and normal != "".join(flipped)
