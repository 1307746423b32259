"""Ed25519 signing keys: generate, load and save as PEM PKCS#8 files readable by the owner only."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..errors import KeyFileError
from .didkey import did_from_public_key

SEED_LEN: Final = 32
MAX_KEY_FILE_BYTES: Final = 16 * 1024  # a PEM Ed25519 key is ~120 bytes


class SigningKey:
    """An Ed25519 private key and its ``did:key`` id; signs messages and round records."""

    __slots__ = ("_key", "did", "public_key")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public_key: bytes = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.did: str = did_from_public_key(self.public_key)

    @classmethod
    def generate(cls) -> SigningKey:
        """A new random key (from the OS's CSPRNG)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> SigningKey:
        """The key whose RFC 8032 32-byte private seed is ``seed`` (tests, derivation)."""
        if len(seed) != SEED_LEN:
            raise ValueError(f"an Ed25519 seed is {SEED_LEN} bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(seed)))

    @classmethod
    def load(cls, path: str | Path) -> SigningKey:
        """Read an unencrypted PEM PKCS#8 Ed25519 key; refuse group/other access like ssh."""
        p = Path(path)
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            raise KeyFileError(
                f"no key file at {p} (create one with `gradstore keygen --out {p}`)"
            ) from None
        except OSError as exc:
            raise KeyFileError(f"cannot open key file {p}: {exc.strerror}") from exc
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise KeyFileError(f"key file {p} is not a regular file")
            if os.name == "posix" and st.st_mode & 0o077:
                raise KeyFileError(
                    f"permissions {stat.S_IMODE(st.st_mode):04o} for key file {p} are too open: "
                    f"it must not be accessible by others (run `chmod 600 {p}`)"
                )
            data = f.read(MAX_KEY_FILE_BYTES + 1)
        if len(data) > MAX_KEY_FILE_BYTES:
            raise KeyFileError(f"key file {p} is too large to be an Ed25519 PEM key")
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except TypeError:
            raise KeyFileError(
                f"key file {p} is encrypted; gradstore needs an unencrypted key"
            ) from None
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise KeyFileError(f"key file {p} is not a PEM PKCS#8 private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"key file {p} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)

    def save(self, path: str | Path) -> None:
        """Write the key as PEM PKCS#8 to a new file with mode 0600; never overwrite."""
        p = Path(path)
        pem = self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise KeyFileError(f"refusing to overwrite existing key file {p}") from None
        except OSError as exc:
            raise KeyFileError(f"cannot create key file {p}: {exc.strerror}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            p.unlink(missing_ok=True)
            raise

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data`` (deterministic, RFC 8032)."""
        return self._key.sign(data)

    def __repr__(self) -> str:
        return f"SigningKey({self.did})"
