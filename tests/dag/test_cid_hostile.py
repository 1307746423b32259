"""Hostile CID text and bytes: ``CID.parse`` gives a CID or ``CIDError``, nothing else escapes.

Strings off the fast path go to ``multiformats``, which raises KeyError, ValueError or
IndexError for text that is no CID (one case of each kind below); those become CIDError,
while an error of any other kind in the decoder (a bug) is not disguised as a bad CID.
Binary CIDs are read by gradstore's own parser.
"""

from __future__ import annotations

import base64
import random

import multiformats
import pytest

from gradstore.dag import CID, DAG_PB
from gradstore.errors import CIDError

NODE_CID = CID.hash(DAG_PB, b"\x0a\x02\x08\x01")


def _b32(raw: bytes) -> str:
    return "b" + base64.b32encode(raw).decode().lower().rstrip("=")


@pytest.mark.parametrize(
    "text",
    [
        "x",  # no multibase has this prefix: MultibaseKeyError (a KeyError)
        "🙂",
        "QmZZZ",  # a CIDv0 that is not 46 characters: no multibase 'Q'
        "k",  # a multibase prefix alone: IndexError
        "b",
        "bafy",  # more padding bits than a base32 digit: DecodingError (a ValueError)
        "b" + "é" * 10,  # not a base32 digit: NonAlphabeticCharError
        "\x00\ud800",  # identity multibase, a lone surrogate: UnicodeEncodeError
        "f01",  # no codec varint: ValueError
        "f01ff",  # a varint cut short
        "f" + "ff" * 40,  # a varint longer than 9 bytes
        "f02",  # CID version 2 is reserved
        "zQm",  # CIDv5
        "f00",  # a malformed CIDv0
        "f018012097ccd",  # an unknown multicodec: MulticodecKeyError (a KeyError)
        "mARKABq7QRUpFug",  # a codec that is no multihash: MultihashKeyError
        "uAQAgN4I8_ebxwmsw",  # a digest shorter than its length says: MultihashValueError
        "f01551221" + "00" * 33,  # sha2-256 with 33 bytes: multiformats objects only when read
        "bafkqaaa",  # a valid CID, identity multihash: not verifiable, refused by gradstore
        _b32(b"\x01\x72" + NODE_CID.multihash),  # libp2p-key: outside the profile
        "/ipfs/",
        "   ",
    ],
)
def test_a_string_that_is_no_cid_of_ours_raises_cid_error(text: str) -> None:
    with pytest.raises(CIDError):
        CID.parse(text)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x01",
        b"\x01\x55\x12",  # cut in the multihash
        b"\x01\x55\x12\x20" + b"\x00" * 31,  # a digest one byte short
        b"\x01\x55\x12\x20" + b"\x00" * 33,  # a trailing byte
        b"\x01" + b"\xff" * 10,  # a varint longer than 63 bits
        b"\x02\x55\x12\x20" + b"\x00" * 32,  # version 2
        b"\x01\x72\x12\x20" + b"\x00" * 32,  # libp2p-key
        b"\x01\x55\x13\x40" + b"\x00" * 64,  # sha2-512
        bytearray(b"\x12\x20" + b"\x00" * 31),  # a CIDv0 one byte short
        memoryview(b"\x00\x00\x00\x00"),
    ],
)
def test_bytes_that_are_no_cid_of_ours_raise_cid_error(raw: bytes) -> None:
    with pytest.raises(CIDError):
        CID.parse(raw)


def _mutations(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(3)
        if kind == 0 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1 and data:
            del data[rng.randrange(len(data)) :]
        else:
            data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
    return bytes(data)


def test_random_and_mutated_cids_give_a_cid_or_cid_error() -> None:
    """Seeded: bytes near a real CID, in every multibase multiformats reads, and noise."""
    rng = random.Random(20260)
    encoders = [
        lambda raw: "f" + raw.hex(),
        lambda raw: "F" + raw.hex().upper(),
        _b32,
        lambda raw: "B" + _b32(raw)[1:].upper(),
        lambda raw: "z" + str(multiformats.multibase.encode(raw, "base58btc"))[1:],
        lambda raw: "m" + base64.b64encode(raw).decode().rstrip("="),
        lambda raw: "u" + base64.urlsafe_b64encode(raw).decode().rstrip("="),
    ]
    parsed = refused = 0
    for _ in range(4000):
        raw = _mutations(rng, NODE_CID.bytes if rng.random() < 0.8 else NODE_CID.multihash)
        noise = "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(8)))
        for value in (raw, rng.choice(encoders)(raw), rng.choice(encoders)(raw)[:-1] + noise):
            try:
                CID.parse(value)
            except CIDError:
                refused += 1
            else:
                parsed += 1
    assert parsed > 0 and refused > 0  # both ways were taken


def test_an_error_of_another_kind_in_the_decoder_is_not_called_a_bad_cid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(cls: object, text: str) -> None:
        raise RuntimeError("a bug in the decoder")

    monkeypatch.setattr(multiformats.CID, "decode", classmethod(broken))
    with pytest.raises(RuntimeError, match="a bug in the decoder"):
        CID.parse("QmdfTbBqBPQ7VNxZEYEj14VmRuZBkqFbiwReogJgS1zR1n")  # CIDv0: multiformats' path
    assert CID.parse(str(NODE_CID)) == NODE_CID  # a canonical CIDv1 never reaches it
