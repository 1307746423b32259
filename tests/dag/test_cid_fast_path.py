"""``CID.parse``'s fast path (a canonical base32 CIDv1 of ours, decoded with the stdlib)
gives exactly what the general path (``multiformats``) gives, and nothing else takes it."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import pytest

from gradstore.dag import CID, DAG_CBOR, DAG_PB, RAW
from gradstore.dag import cid as cid_module
from gradstore.dag.cid import canonical_v1

NODE_CID = CID.hash(DAG_PB, b"\x0a\x02\x08\x01")
ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"


def _b32(raw: bytes) -> str:
    return "b" + base64.b32encode(raw).decode().lower().rstrip("=")


def _general(text: str, monkeypatch: pytest.MonkeyPatch) -> CID:
    with monkeypatch.context() as m:
        m.setattr(cid_module, "canonical_v1", lambda _text: None)
        return CID.parse(text)


@pytest.mark.parametrize("codec", [RAW, DAG_PB, DAG_CBOR])
def test_the_fast_path_agrees_with_multiformats(
    codec: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(100):
        text = str(CID.hash(codec, os.urandom(12)))
        fast = canonical_v1(text)
        assert fast is not None and fast == _general(text, monkeypatch) == CID.parse(text)
        assert str(fast) == text


@pytest.mark.parametrize(
    "text",
    [
        str(NODE_CID)[:-1] + ALPHABET[ALPHABET.index(str(NODE_CID)[-1]) ^ 1],  # padding bit
        str(NODE_CID).upper(),  # base32upper
        _b32(NODE_CID.multihash),  # a bare multihash under a 'b'
        _b32(b"\x02" + NODE_CID.bytes[1:]),  # version 2
        _b32(b"\x01\x72" + NODE_CID.multihash),  # libp2p-key: outside the profile
        "QmdfTbBqBPQ7VNxZEYEj14VmRuZBkqFbiwReogJgS1zR1n",  # CIDv0
        "",
        "bafy",
    ],
)
def test_anything_else_takes_the_general_path(text: str) -> None:
    assert canonical_v1(text) is None


def test_a_canonical_cid_is_parsed_without_loading_multiformats() -> None:
    code = (
        "import sys; from gradstore.dag import CID; "
        f"CID.parse({str(NODE_CID)!r}); "
        "assert 'multiformats' not in sys.modules, 'multiformats was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
