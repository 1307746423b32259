"""Signing keys on disk and did:key ids."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from hypothesis import given
from hypothesis import strategies as st

from gradstore.errors import KeyFileError, MessageError
from gradstore.messages import SigningKey, did_from_public_key, public_key_from_did
from gradstore.messages.didkey import base58btc, from_base58btc, verify_signature

# w3c-ccg/did-method-key test-vectors/ed25519-x25519.json: RFC 8032 seed -> did, and the
# raw public key in base58 (publicKeyBase58).
SPEC_VECTORS = [
    (
        "00" * 32,
        "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp",
        "4zvwRjXUKGfvwnParsHAS3HuSVzV5cA4McphgmoCtajS",
    ),
    (
        "00" * 31 + "01",
        "did:key:z6MkjchhfUsD6mmvni8mCdXHw216Xrm9bQe2mBH1P5RDjVJG",
        "6ASf5EcmmEHTgDJ4X4ZT5vT6iHVJBXPg5AN5YoTCpGWt",
    ),
    (
        "00" * 31 + "04",
        "did:key:z6MkwW6aqMnjgrhJXFUko3NnZPGzVpkNzhYK7yEhnsibmLwL",
        "J3qYF7YJMKCqQke47UQwiHizgFUXapHxRxKmxbkar89x",
    ),
]


@pytest.mark.parametrize(("seed", "did", "pub_b58"), SPEC_VECTORS)
def test_did_key_matches_the_spec_vectors(seed: str, did: str, pub_b58: str) -> None:
    from multiformats import multibase

    key = SigningKey.from_seed(bytes.fromhex(seed))
    assert key.did == did
    assert key.public_key == multibase.decode("z" + pub_b58)
    assert did_from_public_key(key.public_key) == did
    assert public_key_from_did(did) == key.public_key


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "did:key:",
        "did:web:example.com",
        "did:key:f6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp",  # not base58btc
        "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooW",  # one char short
        "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooW0",  # '0' is not base58
        "did:key:z6LShs9GGnqk85isEBzzshkuVWrVKsRp24GnDuHk8QWkARMW",  # x25519, not ed25519
        "did:key:z1" + "6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp",  # leading zero byte
        "did:key:z" + "z" * 500,
    ],
)
def test_public_key_from_did_refuses_other_ids(bad: str) -> None:
    with pytest.raises(MessageError) as info:
        public_key_from_did(bad)
    assert info.value.reason == "malformed"


@given(st.binary(min_size=32, max_size=32))
def test_every_public_key_round_trips_through_its_did(raw: bytes) -> None:
    did = did_from_public_key(raw)
    assert did.startswith("did:key:z6Mk")
    assert public_key_from_did(did) == raw


@given(st.binary(max_size=40))
def test_base58btc_is_multiformats_base58btc(raw: bytes) -> None:
    from multiformats import multibase

    assert "z" + base58btc(raw) == multibase.encode(raw, "base58btc")
    assert from_base58btc(base58btc(raw)) == raw


BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


@given(
    st.text(alphabet=BASE58 + "0OIl+/ \u00e9", max_size=50)
    | st.builds(lambda tail: "6Mk" + tail, st.text(alphabet=BASE58 + "0", max_size=46))
)
def test_from_base58btc_reads_what_multiformats_reads(text: str) -> None:
    from multiformats import multibase

    try:
        expected = multibase.decode("z" + text)
    except ValueError:
        expected = None
    assert from_base58btc(text) == expected
    try:
        key = public_key_from_did("did:key:z" + text)
    except MessageError:
        key = None
    canonical = expected is not None and multibase.encode(expected, "base58btc") == "z" + text
    if canonical and len(expected) == 34 and expected[:2] == b"\xed\x01":
        assert key == expected[2:]
    else:
        assert key is None


def test_did_from_public_key_needs_32_bytes() -> None:
    with pytest.raises(MessageError):
        did_from_public_key(b"\x01" * 31)


def test_sign_verifies_against_the_did_only(peer_key: SigningKey, other_key: SigningKey) -> None:
    sig = peer_key.sign(b"hello")
    assert len(sig) == 64
    assert verify_signature(peer_key.did, b"hello", sig)
    assert not verify_signature(peer_key.did, b"hellO", sig)
    assert not verify_signature(other_key.did, b"hello", sig)
    assert not verify_signature(peer_key.did, b"hello", sig[:-1])


def test_save_creates_0600_and_load_round_trips(tmp_path: Path) -> None:
    key = SigningKey.generate()
    path = tmp_path / "key"
    key.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    loaded = SigningKey.load(str(path))
    assert loaded.did == key.did
    assert loaded.sign(b"x") == key.sign(b"x")


def test_save_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"precious")
    with pytest.raises(KeyFileError, match="overwrite"):
        SigningKey.generate().save(path)
    assert path.read_bytes() == b"precious"


def test_save_keeps_0600_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        SigningKey.generate().save(tmp_path / "key")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "key").stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_load_refuses_keys_others_can_read(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "key"
    SigningKey.generate().save(path)
    path.chmod(mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        SigningKey.load(path)


def test_load_missing_file_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="gradstore keygen"):
        SigningKey.load(tmp_path / "nope")


def _write_0600(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def test_load_refuses_a_non_pem_file(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="not a PEM"):
        SigningKey.load(_write_0600(tmp_path / "key", b"hello"))


def test_load_refuses_another_key_type(tmp_path: Path) -> None:
    pem = generate_private_key(SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(KeyFileError, match="not an Ed25519 key"):
        SigningKey.load(_write_0600(tmp_path / "key", pem))


def test_load_refuses_an_encrypted_key(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw"),
    )
    with pytest.raises(KeyFileError, match="encrypted"):
        SigningKey.load(_write_0600(tmp_path / "key", pem))


def test_repr_shows_the_did_not_the_secret(peer_key: SigningKey) -> None:
    assert repr(peer_key) == f"SigningKey({peer_key.did})"
