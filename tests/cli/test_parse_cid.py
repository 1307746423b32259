"""The CLI's CID argument: the stdlib fast path gives exactly what ``CID.parse`` gives."""

from __future__ import annotations

import base64

import pytest

from gradstore.cli._store_cmds import parse_cid
from gradstore.dag import CID, DAG_PB, RAW
from gradstore.errors import CIDError

RAW_CID = CID.hash(RAW, b"hello")
NODE_CID = CID.hash(DAG_PB, b"\x0a\x02\x08\x01")


def _b32(raw: bytes) -> str:
    return "b" + base64.b32encode(raw).decode().lower().rstrip("=")


@pytest.mark.parametrize(
    "text",
    [
        str(RAW_CID),
        str(NODE_CID),
        f"  {NODE_CID}\n",
        f"/ipfs/{NODE_CID}",
        str(NODE_CID).upper(),  # base32upper: multibase 'B'
        "QmdfTbBqBPQ7VNxZEYEj14VmRuZBkqFbiwReogJgS1zR1n",  # CIDv0
        "zdj7WhuEjrB52m1BisYCtmjH1hSKa7yZ3jEZ9JcXaFRD51wVz",  # base58btc CIDv1
    ],
)
def test_same_cid_as_cid_parse(text: str) -> None:
    assert parse_cid(text) == CID.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "b",
        "bafy",
        "notacid",
        _b32(NODE_CID.multihash),  # a bare multihash under a 'b': no CIDv1 byte
        _b32(b"\x02" + NODE_CID.bytes[1:]),  # version 2
        _b32(b"\x01\x72" + NODE_CID.multihash),  # libp2p-key: outside the profile
        str(NODE_CID)[:-1] + ("b" if str(NODE_CID)[-1] != "b" else "c"),  # another digest
    ],
)
def _same_verdict(text: str) -> None:
    """``parse_cid`` and ``CID.parse`` both refuse ``text``, or both give the same CID."""
    try:
        expected = CID.parse(text)
    except CIDError:
        with pytest.raises(CIDError):
            parse_cid(text)
    else:
        assert parse_cid(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "b",
        "bafy",
        "notacid",
        _b32(NODE_CID.multihash),  # a bare multihash under a 'b': no CIDv1 byte
        _b32(b"\x02" + NODE_CID.bytes[1:]),  # version 2
        _b32(b"\x01\x72" + NODE_CID.multihash),  # libp2p-key: outside the profile
        str(NODE_CID)[:-1] + ("b" if str(NODE_CID)[-1] != "b" else "c"),  # another digest
    ],
)
def test_what_cid_parse_refuses_is_refused(text: str) -> None:
    _same_verdict(text)


def test_non_canonical_base32_is_left_to_cid_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """A last digit with stray low bits is not what gradstore or Kubo print: multiformats
    decides about it, and a canonical string never reaches it."""
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    text = str(NODE_CID)
    stray = text[:-1] + alphabet[alphabet.index(text[-1]) ^ 1]
    _same_verdict(stray)
    calls: list[str] = []
    real = CID.parse

    def spy(value: str) -> CID:
        calls.append(value)
        return real(value)

    monkeypatch.setattr(CID, "parse", spy)
    assert parse_cid(text) == NODE_CID and calls == []
    _same_verdict(stray)
    assert stray in calls
