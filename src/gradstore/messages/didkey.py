"""did:key identifiers for Ed25519 public keys, and signature checks against them.

A did:key is ``did:key:`` + multibase base58btc (``z...``) of multicodec
``ed25519-pub`` (0xed, varint ``ed 01``) + the 32-byte public key, so every id
starts ``did:key:z6Mk``. The base58 and varint work is ``multiformats``'.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from multiformats import multibase, multicodec

from ..errors import MessageError

DID_KEY_PREFIX: Final = "did:key:"
ED25519_PUB_MULTICODEC: Final = multicodec.wrap("ed25519-pub", b"")  # varint(0xed): ed 01
PUBLIC_KEY_LEN: Final = 32
SIGNATURE_LEN: Final = 64
# 34 bytes in base58 are at most 47 characters; anything longer is not ours.
_MAX_DID_LEN: Final = len(DID_KEY_PREFIX) + 1 + 48


def did_from_public_key(raw32: bytes) -> str:
    """The ``did:key:z6Mk...`` id of a raw 32-byte Ed25519 public key."""
    if not isinstance(raw32, bytes | bytearray) or len(raw32) != PUBLIC_KEY_LEN:
        raise MessageError("malformed", "an Ed25519 public key is exactly 32 bytes")
    return DID_KEY_PREFIX + multibase.encode(ED25519_PUB_MULTICODEC + bytes(raw32), "base58btc")


@lru_cache(maxsize=4096)
def public_key_from_did(did: str) -> bytes:
    """The raw 32-byte Ed25519 public key named by ``did`` (canonical spelling only)."""
    if (
        not isinstance(did, str)
        or len(did) > _MAX_DID_LEN
        or not did.startswith(DID_KEY_PREFIX + "z")
    ):
        raise MessageError("malformed", f"not an Ed25519 did:key: {did!r:.80}")
    try:
        raw = multibase.decode(did[len(DID_KEY_PREFIX) :])  # the "z" prefix: base58btc
    except ValueError as exc:  # the multiformats/bases decoding errors are ValueErrors
        raise MessageError("malformed", f"not an Ed25519 did:key: {did!r} ({exc})") from None
    if len(raw) != 2 + PUBLIC_KEY_LEN or raw[:2] != ED25519_PUB_MULTICODEC:
        raise MessageError(
            "malformed", f"not an Ed25519 did:key (expected multicodec ed25519-pub): {did!r}"
        )
    key = raw[2:]
    if did_from_public_key(key) != did:  # e.g. extra leading '1's: one key, one id
        raise MessageError("malformed", f"did:key is not in canonical form: {did!r}")
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
