"""CIDs of the unixfs-v1-2025 profile: CIDv1, sha2-256, raw / dag-pb / dag-cbor.

The hot path builds and prints CIDs with the stdlib; strings from outside are
parsed with ``multiformats`` so every multibase and CIDv0 is understood.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Final, TypeAlias

from ..errors import CIDError

RAW: Final = 0x55
DAG_PB: Final = 0x70
DAG_CBOR: Final = 0x71
SHA2_256: Final = 0x12
SHA2_256_LEN: Final = 32
_CODECS: Final = {RAW: "raw", DAG_PB: "dag-pb", DAG_CBOR: "dag-cbor"}
#: What ``multiformats`` raises for a string that is no CID: an unknown multibase, multicodec
#: or multihash (KeyError), a bad digit, padding, varint, version or digest size (ValueError,
#: UnicodeEncodeError among them), a multibase prefix alone (IndexError). Anything else is a bug
#: and propagates.
_NOT_A_CID: Final = (ValueError, KeyError, IndexError)
# Inside class CID, the name ``bytes`` is the property below, so signatures use this alias.
_BytesLike: TypeAlias = bytes | bytearray | memoryview


def codec_name(codec: int) -> str:
    """The multicodec name of a codec this profile knows (``CIDError`` for any other)."""
    name = _CODECS.get(codec)
    if name is None:
        raise CIDError(f"unsupported CID codec 0x{codec:x} (expected raw, dag-pb or dag-cbor)")
    return name


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


@dataclass(frozen=True, slots=True)
class CID:
    """A sha2-256 CID: ``version`` 1 (the profile) or 0 (legacy ``Qm...`` dag-pb, input only)."""

    codec: int
    digest: bytes
    version: int = 1

    def __post_init__(self) -> None:
        codec_name(self.codec)  # refuses codecs outside the profile
        if len(self.digest) != SHA2_256_LEN:
            raise CIDError(f"sha2-256 digest must be 32 bytes, got {len(self.digest)}")
        if self.version == 0 and self.codec != DAG_PB:
            raise CIDError("CIDv0 is always dag-pb")
        if self.version not in (0, 1):
            raise CIDError(f"unsupported CID version {self.version}")

    @classmethod
    def hash(cls, codec: int, data: bytes | bytearray | memoryview) -> CID:
        """The CIDv1 of ``data`` under ``codec`` (sha2-256)."""
        return cls(codec, hashlib.sha256(data).digest())

    @property
    def multihash(self) -> bytes:
        return bytes((SHA2_256, SHA2_256_LEN)) + self.digest

    @property
    def bytes(self) -> bytes:
        """Binary CID, as in dag-pb links and CAR sections."""
        if self.version == 0:
            return self.multihash
        return b"\x01" + _varint(self.codec) + self.multihash

    @property
    def codec_name(self) -> str:
        return _CODECS[self.codec]

    def __str__(self) -> str:
        if self.version == 0:
            from multiformats import CID as _MFCID

            return str(_MFCID.decode(self.multihash))
        return "b" + base64.b32encode(self.bytes).decode("ascii").lower().rstrip("=")

    def __repr__(self) -> str:
        return f"CID({self})"

    def matches(self, data: _BytesLike) -> bool:
        """True when ``data`` hashes to this CID's digest."""
        return hashlib.sha256(data).digest() == self.digest

    @classmethod
    def from_bytes(cls, raw: _BytesLike) -> CID:
        """Parse a binary CID (exactly, no trailing bytes)."""
        cid, end = cls.read(raw, 0)
        if end != len(raw):
            raise CIDError(f"{len(raw) - end} trailing bytes after binary CID")
        return cid

    @classmethod
    def read(cls, buf: _BytesLike, pos: int) -> tuple[CID, int]:
        """Parse a binary CID starting at ``pos``; return it and the offset after it."""
        b = memoryview(buf)
        if len(b) - pos >= 34 and b[pos] == SHA2_256 and b[pos + 1] == SHA2_256_LEN:
            return cls(DAG_PB, bytes(b[pos + 2 : pos + 34]), 0), pos + 34
        fields = []
        p = pos
        for _ in range(4):  # version, codec, mh code, mh length
            n = shift = 0
            while True:
                if p >= len(b):
                    raise CIDError("truncated binary CID")
                byte = b[p]
                p += 1
                n |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
                if shift > 63:
                    raise CIDError("varint too long in binary CID")
            fields.append(n)
        version, codec, mh_code, mh_len = fields
        if version != 1:
            raise CIDError(f"unsupported CID version {version}")
        if mh_code != SHA2_256 or mh_len != SHA2_256_LEN:
            raise CIDError(
                f"unsupported multihash 0x{mh_code:x}/{mh_len} (only sha2-256 is verifiable here)"
            )
        if p + mh_len > len(b):
            raise CIDError("truncated multihash in binary CID")
        return cls(codec, bytes(b[p : p + mh_len]), 1), p + mh_len

    @classmethod
    def parse(cls, value: str | _BytesLike | CID) -> CID:
        """Parse a CID from a string in any multibase (or CIDv0), binary, or pass one through."""
        if isinstance(value, CID):
            return value
        if isinstance(value, bytes | bytearray | memoryview):
            return cls.from_bytes(value)
        if not isinstance(value, str):
            raise CIDError(f"expected a CID string, got {type(value).__name__}")
        text = value.strip()
        if text.startswith("/ipfs/"):
            text = text[len("/ipfs/") :]
        if not text:
            raise CIDError("empty CID")
        fast = canonical_v1(text)
        if fast is not None:
            return fast
        try:
            from multiformats import CID as _MFCID

            mf = _MFCID.decode(text)
            # read lazily: a sha2-256 digest longer than 32 bytes fails only here
            version, codec, hashfun, digest = mf.version, mf.codec, mf.hashfun, mf.raw_digest
        except _NOT_A_CID as exc:
            raise CIDError(f"not a valid CID: {value!r} ({exc})") from exc
        if hashfun.code != SHA2_256 or len(digest) != SHA2_256_LEN:
            raise CIDError(f"unsupported multihash {hashfun.name} in {value!r} (only sha2-256)")
        if codec.code not in _CODECS:
            raise CIDError(f"unsupported codec {codec.name} in {value!r}")
        return cls(codec.code, bytes(digest), version)

    def to_v1(self) -> CID:
        return CID(self.codec, self.digest, 1)


def verify_block(cid: CID, data: bytes | bytearray | memoryview) -> None:
    """Raise ``IntegrityError`` naming ``cid`` unless ``data`` hashes to it."""
    from ..errors import IntegrityError

    if not cid.matches(data):
        raise IntegrityError(cid)


#: RFC 4648 base32 (lower case) to the digits of Python's int(..., 32): C speed decoding.
_B32_TO_INT: Final = str.maketrans(
    "abcdefghijklmnopqrstuvwxyz234567", "0123456789abcdefghijklmnopqrstuv"
)
_B32_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz234567")
_V1_BYTES: Final = 36  # version, a one-byte codec, sha2-256 and its 32-byte digest
_V1_CHARS: Final = 58  # their base32 characters, without padding


def canonical_v1(text: str) -> CID | None:
    """The CID of ``text`` if it is the canonical base32 string of one of our CIDv1s, else None.

    Our CIDs (raw, dag-pb, dag-cbor; sha2-256) are 36 bytes; decoding such a string exactly,
    with zero padding bits, proves it canonical without re-encoding it and without importing
    ``multiformats`` (about 45 ms). Anything else is for ``CID.parse``'s general path.
    """
    if len(text) != 1 + _V1_CHARS or text[0] != "b" or not _B32_CHARS.issuperset(text[1:]):
        return None
    value = int(text[1:].translate(_B32_TO_INT), 32)
    spare = _V1_CHARS * 5 - _V1_BYTES * 8  # padding bits: zero in a canonical string
    if value & ((1 << spare) - 1):
        return None
    raw = (value >> spare).to_bytes(_V1_BYTES, "big")
    if raw[0] != 1 or raw[1] not in _CODECS or raw[2:4] != bytes((SHA2_256, SHA2_256_LEN)):
        return None
    return CID(raw[1], raw[4:], 1)
