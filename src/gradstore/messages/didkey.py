"""did:key identifiers for Ed25519 public keys, and signature checks against them.

A did:key is ``did:key:`` + multibase base58btc (``z...``) of multicodec
``ed25519-pub`` (0xed, varint ``ed 01``) + the 32-byte public key, so every id
starts ``did:key:z6Mk``. Base58 is done here with Python's integers: ``multiformats``'
checks the runtime type of every call, 0.7 ms an id, and a 4 MiB round record names
29,000 of them (tests/messages/test_keys.py holds this to ``multiformats``' answers).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..errors import MessageError, Reason

DID_KEY_PREFIX: Final = "did:key:"
ED25519_PUB_MULTICODEC: Final = b"\xed\x01"  # multicodec ed25519-pub: varint(0xed)
PUBLIC_KEY_LEN: Final = 32
SIGNATURE_LEN: Final = 64
# 34 bytes in base58 are at most 47 characters; anything longer is not ours.
_MAX_DID_LEN: Final = len(DID_KEY_PREFIX) + 1 + 48
_B58_ALPHABET: Final = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_DIGITS: Final = {c: i for i, c in enumerate(_B58_ALPHABET)}


def base58btc(data: bytes) -> str:
    """Bitcoin's base58 of ``data`` (multibase ``z`` without its prefix)."""
    n = int.from_bytes(data, "big")
    digits = []
    while n:
        n, digit = divmod(n, 58)
        digits.append(_B58_ALPHABET[digit])
    zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * zeros + "".join(reversed(digits))


def from_base58btc(text: str) -> bytes | None:
    """The bytes ``text`` spells in Bitcoin's base58, or None if it is not base58."""
    n = 0
    for char in text:
        digit = _B58_DIGITS.get(char)
        if digit is None:
            return None
        n = n * 58 + digit
    zeros = len(text) - len(text.lstrip("1"))
    return b"\0" * zeros + n.to_bytes((n.bit_length() + 7) // 8, "big")


def did_from_public_key(raw32: bytes) -> str:
    """The ``did:key:z6Mk...`` id of a raw 32-byte Ed25519 public key."""
    if not isinstance(raw32, bytes | bytearray) or len(raw32) != PUBLIC_KEY_LEN:
        raise MessageError(Reason.MALFORMED, "an Ed25519 public key is exactly 32 bytes")
    return DID_KEY_PREFIX + "z" + base58btc(ED25519_PUB_MULTICODEC + bytes(raw32))


@lru_cache(maxsize=4096)
def public_key_from_did(did: str) -> bytes:
    """The raw 32-byte Ed25519 public key named by ``did`` (canonical spelling only)."""
    if (
        not isinstance(did, str)
        or len(did) > _MAX_DID_LEN
        or not did.startswith(DID_KEY_PREFIX + "z")
    ):
        raise MessageError(Reason.MALFORMED, f"not an Ed25519 did:key: {did!r:.80}")
    raw = from_base58btc(did[len(DID_KEY_PREFIX) + 1 :])  # after the "z" prefix: base58btc
    if raw is None:
        raise MessageError(Reason.MALFORMED, f"not an Ed25519 did:key: {did!r} (not base58btc)")
    if len(raw) != 2 + PUBLIC_KEY_LEN or raw[:2] != ED25519_PUB_MULTICODEC:
        raise MessageError(
            Reason.MALFORMED, f"not an Ed25519 did:key (expected multicodec ed25519-pub): {did!r}"
        )
    key = raw[2:]
    if did_from_public_key(key) != did:  # e.g. extra leading '1's: one key, one id
        raise MessageError(Reason.MALFORMED, f"did:key is not in canonical form: {did!r}")
    return key


@lru_cache(maxsize=4096)
def _verifier(did: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(public_key_from_did(did))


def verify_signature(did: str, data: bytes, signature: bytes) -> bool:
    """True when ``signature`` is ``did``'s Ed25519 signature over ``data``."""
    if len(signature) != SIGNATURE_LEN:
        return False
    try:
        _verifier(did).verify(signature, data)
    except InvalidSignature:
        return False
    return True
