"""Deterministic keys and CIDs for message and record tests (Ed25519 signing is deterministic)."""

from __future__ import annotations

import pytest

from gradstore.dag.cid import CID, DAG_CBOR, RAW
from gradstore.messages import SigningKey


def seeded_key(n: int) -> SigningKey:
    """The key whose 32-byte seed is ``n`` big-endian (seed 0 and 1 are did:key spec vectors)."""
    return SigningKey.from_seed(n.to_bytes(32, "big"))


@pytest.fixture
def peer_key() -> SigningKey:
    return seeded_key(1)


@pytest.fixture
def other_key() -> SigningKey:
    return seeded_key(2)


@pytest.fixture
def coord_key() -> SigningKey:
    return seeded_key(100)


def raw_cid(tag: bytes) -> CID:
    return CID.hash(RAW, tag)


def record_cid(tag: bytes) -> CID:
    return CID.hash(DAG_CBOR, tag)
