"""An independent auditor, written from docs/spec.md alone: it re-derives a round's output CID.

It uses Python's standard library only (no NumPy, no gradstore, no multiformats): msgpack,
DAG-CBOR, dag-pb, base32/base58, Ed25519 verification, the float formats and every method
are implemented here, by the words of docs/spec.md, section by section (the § numbers
below). It reads blocks through a ``get_block(cid_bytes) -> bytes`` function and checks
every block's hash, the record's canonical form and signature, each round/4 input's peer
signature, the input documents' canonical encoding, then recomputes the aggregate and its
CID. A stepped round's round/5 record (§9) is audited step by step: each step record is
fetched, checked against the round's link, re-derived as a round/4 record whose peers
signed the step and whose documents hold exactly the step's tensors, and the model-level
document is laid out from the steps' aggregates and its CID compared; a step's inputs may be
compressed (§2.3, checked against the step record's ``codec``, decompressed to binary64) and
any document may span several blocks (§3), as in a round/4 record. It does not check
every payload rule of a compressed document (§2.3's list of refusals) nor the decoder's
size limits: it re-derives, it is not a hardened decoder.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import product
from typing import Any

GetBlock = Callable[[bytes], bytes]


class SpecAuditError(Exception):
    """A check failed; ``check`` names it as docs/audit.md does."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(f"{check}: {message}")
        self.check = check


# -- §0 varints ---------------------------------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


# -- §1.1 CIDs ----------------------------------------------------------------------------

RAW, DAG_PB, DAG_CBOR = 0x55, 0x70, 0x71


def cid_of(codec: int, block: bytes) -> bytes:
    """The binary CIDv1 (sha2-256) of ``block``."""
    return varint(1) + varint(codec) + b"\x12\x20" + hashlib.sha256(block).digest()


def cid_text(cid: bytes) -> str:
    return "b" + base64.b32encode(cid).decode("ascii").lower().rstrip("=")


def parse_cid(text: str) -> bytes:
    """Binary CIDv1 from its base32 text, or from a CIDv0 (``Qm...``: dag-pb, same digest)."""
    if text.startswith("Qm"):
        multihash = b58decode(text)
        return varint(1) + varint(DAG_PB) + multihash
    if not text.startswith("b"):
        raise ValueError(f"not a base32 CID: {text!r}")
    body = text[1:].upper()
    return base64.b32decode(body + "=" * (-len(body) % 8))


def cid_parts(cid: bytes) -> tuple[int, int, bytes]:
    """(version, codec, digest) of a binary CIDv1 (or a CIDv0 multihash)."""
    if cid[:2] == b"\x12\x20":
        return 0, DAG_PB, cid[2:]
    version, pos = read_varint(cid, 0)
    codec, pos = read_varint(cid, pos)
    if cid[pos : pos + 2] != b"\x12\x20" or len(cid) != pos + 34:
        raise ValueError("not a sha2-256 CID")
    return version, codec, cid[pos + 2 :]


def as_v1(cid: bytes) -> bytes:
    _, codec, digest = cid_parts(cid)
    return varint(1) + varint(codec) + b"\x12\x20" + digest


def fetch_block(get_block: GetBlock, cid: bytes, check: str) -> bytes:
    """A block whose SHA-256 is the CID's digest (``check`` fails otherwise)."""
    data = get_block(cid)
    if hashlib.sha256(data).digest() != cid_parts(cid)[2]:
        raise SpecAuditError(check, f"block {cid_text(as_v1(cid))} does not hash to its CID")
    return data


# -- §1.2 did:key and Ed25519 ---------------------------------------------------------------

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def b58decode(text: str) -> bytes:
    n = 0
    for ch in text:
        n = n * 58 + _B58.index(ch)
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    zeros = len(text) - len(text.lstrip("1"))
    return b"\x00" * zeros + body


def b58encode(raw: bytes) -> str:
    n = int.from_bytes(raw, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(raw) - len(raw.lstrip(b"\x00"))) + out


def public_key(did: str) -> bytes:
    """The 32-byte Ed25519 key a did:key names (canonical spelling only)."""
    if not did.startswith("did:key:z"):
        raise ValueError(f"not a did:key: {did!r}")
    raw = b58decode(did[len("did:key:z") :])
    if len(raw) != 34 or raw[:2] != b"\xed\x01" or "did:key:z" + b58encode(raw) != did:
        raise ValueError(f"not a canonical Ed25519 did:key: {did!r}")
    return raw[2:]


# RFC 8032, section 5.1.7 (verification), over edwards25519 in extended coordinates.
_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_Point = tuple[int, int, int, int]


def _add(a: _Point, b: _Point) -> _Point:
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa = (y1 - x1) * (y2 - x2) % _P
    bb = (y1 + x1) * (y2 + x2) % _P
    cc = 2 * t1 * t2 * _D % _P
    dd = 2 * z1 * z2 % _P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def _mul(k: int, p: _Point) -> _Point:
    q: _Point = (0, 1, 1, 0)
    while k:
        if k & 1:
            q = _add(q, p)
        p = _add(p, p)
        k >>= 1
    return q


def _decompress(s: bytes) -> _Point | None:
    y = int.from_bytes(s, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    if x2 == 0:
        if sign:
            return None
        return 0, y, 1, 0
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        return None
    if x & 1 != sign:
        x = _P - x
    return x, y, 1, x * y % _P


def _equal(a: _Point, b: _Point) -> bool:
    return (a[0] * b[2] - b[0] * a[2]) % _P == 0 and (a[1] * b[2] - b[1] * a[2]) % _P == 0


_GY = 4 * pow(5, _P - 2, _P) % _P
_G = _decompress(_GY.to_bytes(32, "little"))


def ed25519_verify(key: bytes, message: bytes, signature: bytes) -> bool:
    """Pure Ed25519 (no pre-hash): ``[S]B == R + [k]A`` with k = SHA-512(R || A || M)."""
    if len(signature) != 64 or len(key) != 32 or _G is None:
        return False
    a = _decompress(key)
    r = _decompress(signature[:32])
    s = int.from_bytes(signature[32:], "little")
    if a is None or r is None or s >= _L:
        return False
    k = int.from_bytes(hashlib.sha512(signature[:32] + key + message).digest(), "little") % _L
    return _equal(_mul(s, _G), _add(r, _mul(k, a)))


# -- §2.1 msgpack -------------------------------------------------------------------------


def mp_int(v: int) -> bytes:
    if v >= 0:
        if v < 0x80:
            return bytes([v])
        for tag, fmt, top in ((0xCC, ">B", 1 << 8), (0xCD, ">H", 1 << 16), (0xCE, ">I", 1 << 32)):
            if v < top:
                return bytes([tag]) + struct.pack(fmt, v)
        return b"\xcf" + struct.pack(">Q", v)
    if v >= -32:
        return bytes([v & 0xFF])
    for tag, fmt, low in (
        (0xD0, ">b", -(1 << 7)),
        (0xD1, ">h", -(1 << 15)),
        (0xD2, ">i", -(1 << 31)),
    ):
        if v >= low:
            return bytes([tag]) + struct.pack(fmt, v)
    return b"\xd3" + struct.pack(">q", v)


def _mp_head(k: int, small_base: int, small_limit: int, tags: Sequence[int]) -> bytes:
    if k < small_limit:
        return bytes([small_base + k])
    for tag, fmt, top in zip(tags, (">B", ">H", ">I"), (1 << 8, 1 << 16, 1 << 32), strict=False):
        if tag and k < top:
            return bytes([tag]) + struct.pack(fmt, k)
    raise ValueError("too long")


def mp_str(s: str) -> bytes:
    raw = s.encode("utf-8")
    return _mp_head(len(raw), 0xA0, 32, (0xD9, 0xDA, 0xDB)) + raw


def mp_bin_header(k: int) -> bytes:
    return _mp_head(k, 0, 0, (0xC4, 0xC5, 0xC6))


def mp_array_header(k: int) -> bytes:
    return _mp_head(k, 0x90, 16, (0, 0xDC, 0xDD))


def mp_map_header(k: int) -> bytes:
    return _mp_head(k, 0x80, 16, (0, 0xDE, 0xDF))


def mp_meta(v: Any) -> bytes:
    """A meta value, maps with keys sorted by UTF-8 bytes, floats as ``cb`` (§2.2)."""
    if v is None:
        return b"\xc0"
    if v is True or v is False:
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int):
        return mp_int(v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        return mp_str(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return mp_bin_header(len(v)) + bytes(v)
    if isinstance(v, list):
        return mp_array_header(len(v)) + b"".join(mp_meta(x) for x in v)
    if isinstance(v, dict):
        keys = sorted(v, key=lambda k: k.encode("utf-8"))
        return mp_map_header(len(keys)) + b"".join(mp_str(k) + mp_meta(v[k]) for k in keys)
    raise TypeError(f"not a meta value: {type(v).__name__}")


class Pairs(list[tuple[Any, Any]]):
    """A decoded msgpack map: its (key, value) pairs in wire order."""


class MsgpackReader:
    """Reads msgpack values from ``buf`` (maps as ``Pairs``, bins as memoryviews)."""

    def __init__(self, buf: memoryview, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def _take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise ValueError("truncated msgpack")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def _uint(self, size: int) -> int:
        return int.from_bytes(self._take(size), "big")

    def value(self) -> Any:
        b = self._take(1)[0]
        if b < 0x80:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self._map(b & 0x0F)
        if 0x90 <= b <= 0x9F:
            return [self.value() for _ in range(b & 0x0F)]
        if 0xA0 <= b <= 0xBF:
            return bytes(self._take(b & 0x1F)).decode("utf-8")
        simple = {0xC0: None, 0xC2: False, 0xC3: True}
        if b in simple:
            return simple[b]
        if b in (0xC4, 0xC5, 0xC6):
            return self._take(self._uint({0xC4: 1, 0xC5: 2, 0xC6: 4}[b]))
        if b == 0xCA:
            return struct.unpack(">f", self._take(4))[0]
        if b == 0xCB:
            return struct.unpack(">d", self._take(8))[0]
        if b in (0xCC, 0xCD, 0xCE, 0xCF):
            return self._uint({0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}[b])
        if b in (0xD0, 0xD1, 0xD2, 0xD3):
            size = {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}[b]
            return int.from_bytes(self._take(size), "big", signed=True)
        if b in (0xD9, 0xDA, 0xDB):
            return bytes(self._take(self._uint({0xD9: 1, 0xDA: 2, 0xDB: 4}[b]))).decode("utf-8")
        if b in (0xDC, 0xDD):
            return [self.value() for _ in range(self._uint(2 if b == 0xDC else 4))]
        if b in (0xDE, 0xDF):
            return self._map(self._uint(2 if b == 0xDE else 4))
        raise ValueError(f"msgpack type 0x{b:02x} is not used by gradstore")

    def _map(self, n: int) -> Pairs:
        return Pairs((self.value(), self.value()) for _ in range(n))


def meta_value(v: Any) -> Any:
    """A decoded meta value with maps as dicts (their order is checked by re-encoding)."""
    if isinstance(v, Pairs):
        return {k: meta_value(x) for k, x in v}
    if isinstance(v, list):
        return [meta_value(x) for x in v]
    if isinstance(v, memoryview):
        return bytes(v)
    return v


# -- §2.2, §2.3 documents and §6.9 float formats ---------------------------------------------

ITEMSIZE = {
    "<f2": 2, "<f4": 4, "<f8": 8, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "|i1": 1, "|u1": 1, "<i2": 2, "<u2": 2, "<i4": 4, "<u4": 4, "<i8": 8, "<u8": 8, "|b1": 1,
}  # fmt: skip
FLOATS = ("<f2", "<f4", "<f8", "bfloat16", "float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True)
class Format:
    """§6.9: fraction bits, smallest normal exponent, largest finite value, what overflows."""

    p: int
    emin: int
    largest: float
    beyond: float


FORMATS = {
    "<f4": Format(23, -126, (2 - 2**-23) * 2.0**127, math.inf),
    "<f2": Format(10, -14, 65504.0, math.inf),
    "bfloat16": Format(7, -126, (2 - 2**-7) * 2.0**127, math.inf),
    "float8_e4m3fn": Format(3, -6, 448.0, math.nan),
    "float8_e5m2": Format(2, -14, 57344.0, math.inf),
}


def round_to(dtype: str, x: float) -> float:
    """§6.9: ``x`` rounded to nearest, ties to even, exactly from binary64."""
    if dtype == "<f8" or x == 0 or math.isnan(x) or math.isinf(x):
        return x
    fmt = FORMATS[dtype]
    _, e = math.frexp(x)  # |x| = m 2^e, 1/2 <= m < 1: floor(log2 |x|) = e - 1
    big_e = max(e - 1, fmt.emin)
    q = round(math.ldexp(x, fmt.p - big_e))  # exact scaling; round() is ties-to-even
    r = math.copysign(math.ldexp(q, big_e - fmt.p), x)
    if abs(r) > fmt.largest:
        return math.copysign(fmt.beyond, x)
    return r


def _float8_value(code: int, ebits: int, mbits: int, e4m3fn: bool) -> float:
    sign = -1.0 if code >> (ebits + mbits) else 1.0
    exp = (code >> mbits) & ((1 << ebits) - 1)
    frac = code & ((1 << mbits) - 1)
    bias = (1 << (ebits - 1)) - 1
    top = (1 << ebits) - 1
    if e4m3fn and exp == top and frac == (1 << mbits) - 1:
        return math.nan
    if not e4m3fn and exp == top:
        return sign * math.inf if frac == 0 else math.nan
    if exp == 0:
        return sign * math.ldexp(frac, 1 - bias - mbits)
    return sign * math.ldexp((1 << mbits) + frac, exp - bias - mbits)


E4M3 = [_float8_value(c, 4, 3, True) for c in range(256)]
E5M2 = [_float8_value(c, 5, 2, False) for c in range(256)]


def _codes(table: list[float]) -> dict[bytes, int]:
    """Each finite value's binary64 bytes (sign included) -> its code."""
    return {struct.pack("<d", v): code for code, v in enumerate(table) if v == v}


E4M3_CODES, E5M2_CODES = _codes(E4M3), _codes(E5M2)


def decode_floats(dtype: str, raw: bytes | memoryview) -> list[float]:
    """Elements of a float dtype, widened (LE)."""
    raw = bytes(raw)
    n = len(raw) // ITEMSIZE[dtype]
    if dtype == "<f8":
        return list(struct.unpack(f"<{n}d", raw))
    if dtype == "<f4":
        return list(struct.unpack(f"<{n}f", raw))
    if dtype == "<f2":
        return list(struct.unpack(f"<{n}e", raw))
    if dtype == "bfloat16":
        halves = struct.unpack(f"<{n}H", raw)
        return list(struct.unpack(f"<{n}f", struct.pack(f"<{n}I", *(h << 16 for h in halves))))
    table = E4M3 if dtype == "float8_e4m3fn" else E5M2
    return [table[b] for b in raw]


def encode_floats(dtype: str, values: Sequence[float]) -> bytes:
    """Already rounded values in a float dtype's bytes (LE)."""
    n = len(values)
    if dtype == "<f8":
        return struct.pack(f"<{n}d", *values)
    if dtype == "<f4":
        return struct.pack(f"<{n}f", *values)
    if dtype == "<f2":
        return struct.pack(f"<{n}e", *values)
    if dtype == "bfloat16":
        words = struct.unpack(f"<{n}I", struct.pack(f"<{n}f", *values))
        return struct.pack(f"<{n}H", *(w >> 16 for w in words))
    codes = E4M3_CODES if dtype == "float8_e4m3fn" else E5M2_CODES
    return bytes(codes[struct.pack("<d", v)] for v in values)


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    data: memoryview  # dense data, or a compressed payload

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class Document:
    format: str
    meta: dict[str, Any]
    codec: dict[str, Any] | None
    tensors: list[Tensor]


def encode_document(
    meta: dict[str, Any], tensors: Sequence[tuple[str, str, tuple[int, ...], bytes]],
    codec: dict[str, Any] | None = None,
) -> bytes:  # fmt: skip
    """§2.2 (and §2.3 with ``codec``): the canonical bytes of a document (its tensors sorted
    by the UTF-8 bytes of their names)."""
    return write_document(meta, sorted(tensors, key=lambda t: t[0].encode("utf-8")), codec)


def write_document(
    meta: dict[str, Any], ordered: Sequence[tuple[str, str, tuple[int, ...], bytes]],
    codec: dict[str, Any] | None = None,
) -> bytes:  # fmt: skip
    """§2.2's layout of a document whose tensors are ``ordered`` (the caller sorts them)."""
    out = bytearray(b"\x84" if codec is not None else b"\x83")
    out += mp_str("format") + mp_str("gradstore/2" if codec is not None else "gradstore/1")
    out += mp_str("meta") + mp_meta(meta)
    if codec is not None:
        out += mp_str("codec") + mp_map_header(len(codec))
        for key, value in codec.items():  # name first, then the parameters in their order
            out += mp_str(key) + (mp_str(value) if isinstance(value, str) else mp_int(value))
    out += mp_str("tensors") + mp_array_header(len(ordered))
    for name, dtype, shape, data in ordered:
        out += b"\x85" + mp_str("name") + mp_str(name) + mp_str("dtype") + mp_str(dtype)
        out += mp_str("shape") + mp_array_header(len(shape)) + b"".join(mp_int(d) for d in shape)
        out += mp_str("pad")
        data_header = mp_bin_header(len(data))
        unpadded = len(out) + 2 + len(mp_str("data")) + len(data_header)
        pad = -unpadded % 64
        out += bytes([0xC4, pad]) + bytes(pad) + mp_str("data") + data_header + data
    return bytes(out)


def decode_document(buf: bytes) -> Document:
    """§2.2/§2.3: parse a document and check it is its own canonical encoding."""
    mv = memoryview(buf)
    reader = MsgpackReader(mv)
    top = reader.value()
    if reader.pos != len(buf) or not isinstance(top, Pairs):
        raise ValueError("not one msgpack map")
    keys = [k for k, _ in top]
    fields = dict(top)
    if keys == ["format", "meta", "tensors"] and fields["format"] == "gradstore/1":
        codec = None
    elif keys == ["format", "meta", "codec", "tensors"] and fields["format"] == "gradstore/2":
        codec = dict(fields["codec"])
    else:
        raise ValueError(f"not a gradstore document (keys {keys})")
    meta = meta_value(fields["meta"])
    if not isinstance(meta, dict):
        raise ValueError("meta is not a map")
    tensors = []
    for entry in fields["tensors"]:
        if [k for k, _ in entry] != ["name", "dtype", "shape", "pad", "data"]:
            raise ValueError("a tensor map has other keys")
        t = dict(entry)
        if t["dtype"] not in ITEMSIZE or (codec is not None and t["dtype"] not in FLOATS):
            raise ValueError(f"dtype {t['dtype']!r}")
        tensors.append(Tensor(t["name"], t["dtype"], tuple(t["shape"]), t["data"]))
    again = encode_document(
        meta,
        [(t.name, t.dtype, t.shape, bytes(t.data)) for t in tensors],
        codec,
    )
    if again != buf:
        raise ValueError("not the canonical encoding of its content")
    for t in tensors:
        want = payload_nbytes(codec, t.size) if codec else t.size * ITEMSIZE[t.dtype]
        if len(t.data) != want:
            raise ValueError(f"tensor {t.name!r} holds {len(t.data)} bytes, not {want}")
    return Document(fields["format"], meta, codec, tensors)


# -- §2.3 compressed payloads -----------------------------------------------------------------


def _group(codec: dict[str, Any]) -> int:
    return {"bf16": 1, "fp16": 1, "int8": codec.get("block", 0), "topk": codec.get("chunk", 0)}[
        codec["name"]
    ]


def _kept(codec: dict[str, Any], length: int) -> int:
    return (codec["k"] * length + codec["chunk"] - 1) // codec["chunk"]


def _record_nbytes(codec: dict[str, Any], length: int) -> int:
    name = codec["name"]
    if name in ("bf16", "fp16"):
        return 2 * length
    if name == "int8":
        return 4 + length
    kept = _kept(codec, length)
    header = {"bf16": 0, "int8": 4, "2bit": 8}[codec["values"]]
    values = {"bf16": 2 * kept, "int8": kept, "2bit": (kept + 3) // 4}[codec["values"]]
    positions = (3 * kept + 1) // 2 if codec["index"] == 12 else 2 * kept
    return header + values + positions


def payload_nbytes(codec: dict[str, Any], count: int) -> int:
    g = _group(codec)
    full, rest = divmod(count, g)
    return full * _record_nbytes(codec, g) + (_record_nbytes(codec, rest) if rest else 0)


def _f32(raw: bytes | memoryview) -> float:
    return float(struct.unpack("<f", bytes(raw))[0])


def decompress(codec: dict[str, Any], payload: memoryview, count: int) -> list[float]:
    """§2.3 decompression: every element as binary64."""
    name = codec["name"]
    if name == "bf16":
        return decode_floats("bfloat16", payload)
    if name == "fp16":
        return decode_floats("<f2", payload)
    out: list[float] = []
    g = _group(codec)
    pos = 0
    for start in range(0, count, g):
        length = min(g, count - start)
        record = bytes(payload[pos : pos + _record_nbytes(codec, length)])
        pos += len(record)
        if name == "int8":
            scale = _f32(record[:4])
            out += [scale * q for q in struct.unpack(f"<{length}b", record[4:])]
            continue
        kept = _kept(codec, length)
        fmt = codec["values"]
        header = {"bf16": 0, "int8": 4, "2bit": 8}[fmt]
        nvalues = {"bf16": 2 * kept, "int8": kept, "2bit": (kept + 3) // 4}[fmt]
        raw_values = record[header : header + nvalues]
        raw_positions = record[header + nvalues :]
        if fmt == "bf16":
            values = decode_floats("bfloat16", raw_values)
        elif fmt == "int8":
            scale = _f32(record[:4])
            values = [scale * q for q in struct.unpack(f"<{kept}b", raw_values)]
        else:
            lo, hi = _f32(record[:4]), _f32(record[4:8])
            values = []
            for j in range(kept):
                code = (raw_values[j // 4] >> (2 * (j % 4))) & 3
                level = hi if code & 1 else lo
                values.append(-level if code & 2 else level)
        if codec["index"] == 16:
            positions = list(struct.unpack(f"<{kept}H", raw_positions))
        else:
            bits = int.from_bytes(raw_positions, "little")
            positions = [(bits >> (12 * j)) & 0xFFF for j in range(kept)]
        dense = [0.0] * length
        for p, v in zip(positions, values, strict=True):
            dense[p] = v
        out += dense
    return out


def tensor_values(doc: Document, t: Tensor) -> list[float]:
    """§6.1: the tensor's elements as binary64 (widened or decompressed)."""
    if doc.codec is None:
        return decode_floats(t.dtype, t.data)
    return decompress(doc.codec, t.data, t.size)


# -- §3 the CID of a document ---------------------------------------------------------------

CHUNK = 1 << 20
MAX_LINKS = 1024


def _node(children: list[tuple[bytes, int, int]]) -> tuple[bytes, tuple[bytes, int, int]]:
    """A dag-pb node over (cid, filesize, tsize) children: its block and its own triple."""
    links = bytearray()
    for cid, _, tsize in children:
        link = b"\x0a" + varint(len(cid)) + cid + b"\x12\x00" + b"\x18" + varint(tsize)
        links += b"\x12" + varint(len(link)) + link
    filesize = sum(c[1] for c in children)
    data = b"\x08\x02\x18" + varint(filesize) + b"".join(b"\x20" + varint(c[1]) for c in children)
    block = bytes(links) + b"\x0a" + varint(len(data)) + data
    return block, (cid_of(DAG_PB, block), filesize, len(block) + sum(c[2] for c in children))


def file_cid(data: bytes, chunk: int = CHUNK, max_links: int = MAX_LINKS) -> bytes:
    """§3: the root CID of ``data`` under unixfs-v1-2025 (smaller sizes for tests)."""
    leaves = iter(
        [(cid_of(RAW, data[i : i + chunk]), len(data[i : i + chunk]))
         for i in range(0, len(data), chunk)] or [(cid_of(RAW, b""), 0)]
    )  # fmt: skip
    pending: list[tuple[bytes, int]] = []

    def next_leaf() -> tuple[bytes, int] | None:
        if pending:
            return pending.pop()
        return next(leaves, None)

    def remain() -> bool:
        leaf = next_leaf()
        if leaf is None:
            return False
        pending.append(leaf)
        return True

    def fill(children: list[tuple[bytes, int, int]], depth: int) -> tuple[bytes, int, int]:
        while len(children) < max_links and remain():
            if depth == 1:
                leaf = next_leaf()
                assert leaf is not None
                children.append((leaf[0], leaf[1], leaf[1]))
            else:
                children.append(fill([], depth - 1))
        return _node(children)[1]

    first = next_leaf()
    assert first is not None
    root = (first[0], first[1], first[1])
    depth = 1
    while remain():
        root = fill([root], depth)
        depth += 1
    return root[0]


def read_file(get_block: GetBlock, root: bytes, check: str) -> bytes:
    """The bytes of a UnixFS file (raw leaves under dag-pb nodes), every block hash-checked."""
    _, codec, _ = cid_parts(root)
    block = fetch_block(get_block, root, check)
    if codec == RAW:
        return block
    if codec != DAG_PB:
        raise SpecAuditError(check, "not a UnixFS file")
    out = bytearray()
    pos = 0
    while pos < len(block) and block[pos] == 0x12:
        length, pos = read_varint(block, pos + 1)
        link = block[pos : pos + length]
        pos += length
        cid_len, at = read_varint(link, 1)
        out += read_file(get_block, link[at : at + cid_len], check)
    return bytes(out)


# -- §5.1 DAG-CBOR ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    cid: bytes


def _cbor_head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([major << 5 | n])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * size):
            return bytes([major << 5 | extra]) + n.to_bytes(size, "big")
    raise ValueError("integer too large")


def cbor_encode(v: Any) -> bytes:
    if v is None:
        return b"\xf6"
    if v is True or v is False:
        return b"\xf5" if v else b"\xf4"
    if isinstance(v, int):
        return _cbor_head(0, v) if v >= 0 else _cbor_head(1, -1 - v)
    if isinstance(v, float):
        return b"\xfb" + struct.pack(">d", v)
    if isinstance(v, str):
        raw = v.encode("utf-8")
        return _cbor_head(3, len(raw)) + raw
    if isinstance(v, bytes):
        return _cbor_head(2, len(v)) + v
    if isinstance(v, Link):
        return b"\xd8\x2a" + cbor_encode(b"\x00" + v.cid)
    if isinstance(v, list):
        return _cbor_head(4, len(v)) + b"".join(cbor_encode(x) for x in v)
    if isinstance(v, dict):
        keys = sorted(v, key=lambda k: (len(k.encode("utf-8")), k.encode("utf-8")))
        return _cbor_head(5, len(keys)) + b"".join(cbor_encode(k) + cbor_encode(v[k]) for k in keys)
    raise TypeError(type(v).__name__)


def cbor_decode(buf: bytes) -> Any:
    value, pos = _cbor_item(buf, 0)
    if pos != len(buf):
        raise ValueError("bytes after the CBOR item")
    return value


def _cbor_item(buf: bytes, pos: int) -> tuple[Any, int]:
    first = buf[pos]
    major, info = first >> 5, first & 0x1F
    pos += 1
    if major == 7:
        if info == 27:
            return struct.unpack(">d", buf[pos : pos + 8])[0], pos + 8
        simple = {20: False, 21: True, 22: None}
        if info in simple:
            return simple[info], pos
        raise ValueError(f"CBOR simple value {info} is not DAG-CBOR")
    if info < 24:
        n = info
    else:
        size = {24: 1, 25: 2, 26: 4, 27: 8}[info]
        n = int.from_bytes(buf[pos : pos + size], "big")
        pos += size
    if major == 0:
        return n, pos
    if major == 1:
        return -1 - n, pos
    if major in (2, 3):
        raw = buf[pos : pos + n]
        return (raw if major == 2 else raw.decode("utf-8")), pos + n
    if major == 4:
        items = []
        for _ in range(n):
            item, pos = _cbor_item(buf, pos)
            items.append(item)
        return items, pos
    if major == 5:
        out = {}
        for _ in range(n):
            key, pos = _cbor_item(buf, pos)
            out[key], pos = _cbor_item(buf, pos)
        return out, pos
    if major == 6 and n == 42:
        raw, pos = _cbor_item(buf, pos)
        return Link(raw[1:]), pos
    raise ValueError(f"CBOR major type {major} tag {n} is not in a round record")


# -- §4 the signed announcement ---------------------------------------------------------------


def announcement_bytes(
    job: str, run: str, round_: int, peer: str, cid: str, num_samples: int, sent_at: int,
    step: str | None = None,
) -> bytes:  # fmt: skip
    """The msgpack map a peer signs: nine pairs, or ten with ``step`` right after ``round``
    (§4, §9.1: a stepped job's announcement)."""
    pairs = [
        ("v", mp_int(2)), ("type", mp_str("announce")), ("job", mp_str(job)),
        ("run", mp_str(run)), ("round", mp_int(round_)),
        *([("step", mp_str(step))] if step is not None else []),
        ("peer", mp_str(peer)), ("cid", mp_str(cid)), ("num_samples", mp_int(num_samples)),
        ("sent_at", mp_int(sent_at)),
    ]  # fmt: skip
    return mp_map_header(len(pairs)) + b"".join(mp_str(k) + v for k, v in pairs)


# -- §6 the arithmetic ----------------------------------------------------------------------


def norm_sequential(values: Sequence[float]) -> float:
    """§6.2, round/4."""
    total = 0.0
    for v in values:
        total = total + v * v
    return math.sqrt(total)


def _pairwise(a: Sequence[float], lo: int, n: int) -> float:
    """§6.2: NumPy's pairwise summation of ``a[lo : lo + n]``."""
    if n < 8:
        s = 0.0
        for i in range(lo, lo + n):
            s = s + a[i]
        return s
    if n <= 128:
        r = list(a[lo : lo + 8])
        i = 8
        while i < n - n % 8:
            for j in range(8):
                r[j] = r[j] + a[lo + i + j]
            i += 8
        s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            s = s + a[lo + i]
            i += 1
        return s
    h = n // 2
    h -= h % 8
    return _pairwise(a, lo, h) + _pairwise(a, lo + h, n - h)


def norm_blocked_pairwise(tensors: Sequence[Sequence[float]]) -> float:
    """§6.2, round/2 and round/3: blocks of 65,536 from each tensor's start."""
    total = 0.0
    for values in tensors:
        for lo in range(0, len(values), 1 << 16):
            squares = [v * v for v in values[lo : lo + (1 << 16)]]
            total = total + _pairwise(squares, 0, len(squares))
    return math.sqrt(total)


def gradient_norm(tensors: Sequence[Sequence[float]], version: str) -> float:
    if version in SIGNED:  # round/4 and the step records (§9.2: round/4's arithmetic)
        return norm_sequential([v for t in tensors for v in t])
    return norm_blocked_pairwise(tensors)


def linear(xs: Sequence[Sequence[float]], coefs: Sequence[float], divisor: float) -> list[float]:
    """§6.4: ``acc = c0 x0``, ``acc = acc + ci xi`` in order, then ``acc / D`` (binary64)."""
    out = []
    for e in range(len(xs[0])):
        acc = coefs[0] * xs[0][e]
        for i in range(1, len(xs)):
            acc = acc + coefs[i] * xs[i][e]
        out.append(acc / divisor)
    return out


def linear_exact(
    xs: Sequence[Sequence[float]], coefs: Sequence[float], divisor: float
) -> list[float]:
    """§6.4, ``accumulate = "exact"``: the terms ``fl(ci xi)`` summed exactly (rationals),
    rounded once to nearest even (``float`` of a Fraction), an exact zero -0.0 only when
    every term is -0.0; then ``acc / D``."""
    out = []
    for e in range(len(xs[0])):
        terms = [coefs[i] * xs[i][e] for i in range(len(xs))]
        exact = sum((Fraction(t) for t in terms), Fraction(0))
        if exact == 0:
            negative = all(math.copysign(1.0, t) < 0 for t in terms)
            acc = -0.0 if negative else 0.0
        else:
            try:
                acc = float(exact)
            except OverflowError:
                raise SpecAuditError("aggregate", "the exact sum overflows binary64") from None
        out.append(acc / divisor)
    return out


def trimmed_per_side(n: int, r: float) -> int:
    """§6.5: floor(fl(fl(n * r) + 1e-9))."""
    return math.floor(float(n) * r + 1e-9)


def order_statistic(ys: Sequence[Sequence[float]], first: int, stop: int) -> list[float]:
    """§6.5: sorted rows ``first .. stop-1``, summed in order from the first, divided."""
    out = []
    for e in range(len(ys[0])):
        v = sorted(y[e] for y in ys)
        if stop - first == 1:
            value = v[first]
        else:
            acc = v[first]
            for j in range(first + 1, stop):
                acc = acc + v[j]
            value = acc / (stop - first)
        out.append(0.0 if value == 0 else value)
    return out


def rank_key(score: float) -> float:
    """§6.6 step 3: the score at 9 significant digits."""
    return float(f"{score:.8e}")


def borderline_keys(score: float) -> tuple[float, ...]:
    """§6.6: both neighbouring keys when the score is within 1e-11 (relative) of a boundary."""
    keys = {rank_key(score * (1 - 1e-11)), rank_key(score), rank_key(score * (1 + 1e-11))}
    return tuple(sorted(keys))


def krum_selection(
    ys: Sequence[Sequence[float]], f: int, m: int, recorded: tuple[int, ...]
) -> tuple[int, ...]:
    """§6.6 steps 1-4 with the near-tie rule: the selection (indices in record order)."""
    n = len(ys)
    dist = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            d = math.fsum((a - b) * (a - b) for a, b in zip(ys[i], ys[j], strict=True))
            dist[i][j] = dist[j][i] = d
    scores = [
        math.fsum(sorted(dist[i][j] for j in range(n) if j != i)[: n - f - 2]) for i in range(n)
    ]
    choices = [borderline_keys(s) for s in scores]
    possible = set()
    for keys in product(*choices):  # 2^b choices for b borderline scores: b is small
        ranked = sorted(range(n), key=lambda i: (keys[i], i))
        possible.add(tuple(sorted(ranked[:m])))
    if len(possible) == 1:
        return possible.pop()
    if recorded in possible:
        return recorded
    raise SpecAuditError(
        "input-weight", f"the record's Krum selection {recorded} is not one of {sorted(possible)}"
    )


# -- §5, §7 and §9: the records, their checks, and the re-derived outputs ---------------------

ROUND2, ROUND3, ROUND4 = "gradstore/round/2", "gradstore/round/3", "gradstore/round/4"
ROUND5, STEP1 = "gradstore/round/5", "gradstore/step/1"
#: Records whose inputs carry their peers' signatures and whose arithmetic is round/4's (§9.2).
SIGNED = (ROUND4, STEP1)
MAX_RECORD = 4 << 20

ROUND_KEYS = frozenset(
    {"type", "job", "run", "round", "method", "params", "inputs", "excluded", "output", "prev",
     "coordinator", "sig"}
)  # fmt: skip
STEP_KEYS = ROUND_KEYS - {"prev"} | {"step", "tensors"}  # §9.2
ROUND5_KEYS = frozenset({"type", "job", "run", "round", "steps", "output", "prev", "coordinator",
                         "sig"})  # fmt: skip
INPUT_KEYS = {
    ROUND2: frozenset({"peer", "gradient", "num_samples", "weight"}),
    ROUND3: frozenset({"peer", "gradient", "num_samples", "weight", "codec"}),
    ROUND4: frozenset({"peer", "gradient", "num_samples", "weight", "codec", "sent_at",
                       "peer_sig"}),
}  # fmt: skip
INPUT_KEYS[STEP1] = INPUT_KEYS[ROUND4]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # job and step names (§5.2, §9)
_CONTROLS = frozenset(
    [*range(0x20), *range(0x7F, 0xA0), 0x061C, 0x200E, 0x200F, 0x2028, 0x2029,
     *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
)  # fmt: skip


@dataclass
class Audit:
    """What the reference re-derived for one record (a round/2-4 record or a step record)."""

    record: dict[str, Any]
    output: bytes  # the recomputed output CID (binary)
    tensors: dict[str, tuple[str, tuple[int, ...], list[float]]]  # the rounded aggregate
    selected: tuple[int, ...] | None = None


@dataclass
class SteppedAudit:
    """What the reference re-derived for a round/5 record (§9): each closed step's audit and
    the failed steps' reasons, by step in the record's order, and the model-level document."""

    record: dict[str, Any]
    output: bytes  # the recomputed model-level document's CID (binary)
    steps: dict[str, Audit]
    failed: dict[str, str]
    model_meta: dict[str, Any]
    model_tensors: list[str]  # the model document's tensor names, in document order


def tensor_name_ok(name: str) -> bool:
    """§2.2's rule for a name: no control or bidi character, not absolute, no ``..`` segment."""
    if not name or any(ord(c) in _CONTROLS for c in name):
        return False
    if name[0] in "/\\" or (len(name) > 2 and name[0].isascii() and name[0].isalpha()
                            and name[1] == ":" and name[2] in "/\\"):  # fmt: skip
        return False
    return ".." not in re.split(r"[/\\]", name)


def selector_ok(selector: Any) -> bool:
    """§9.2: a tensor name without ``*``, or ``prefix.*`` (``prefix`` non-empty, no ``*``)."""
    if not isinstance(selector, str):
        return False
    pattern = selector.endswith(".*") and len(selector) > 2
    text = selector[:-1] if pattern else selector  # the name, or prefix.
    return "*" not in text and tensor_name_ok(text)


def selector_takes(selector: str, name: str) -> bool:
    """§9.2: ``prefix.*`` takes every name starting with ``prefix.``; a name takes itself."""
    if selector.endswith(".*") and len(selector) > 2:
        return name.startswith(selector[:-1])
    return name == selector


def check_step_tensors(selectors: Sequence[str], names: Sequence[str], what: str) -> None:
    """§9.2 ``step-tensors``: each name taken by a selector, each selector taking a name."""
    for name in names:
        if not any(selector_takes(s, name) for s in selectors):
            raise SpecAuditError("step-tensors", f"{what} holds {name!r}, which no selector takes")
    for s in selectors:
        if not any(selector_takes(s, name) for name in names):
            raise SpecAuditError("step-tensors", f"{what} holds no tensor that {s!r} takes")


def fetch_node(get_block: GetBlock, cid: bytes, what: str) -> dict[str, Any]:
    """§5.1: a record's block (dag-cbor, hash-checked, at most 4 MiB) decoded, in canonical
    DAG-CBOR. Its keys and signature are checked by the caller, who knows its type."""
    if cid_parts(cid)[1] != DAG_CBOR:
        raise SpecAuditError("record-cid", f"a {what} is dag-cbor")
    data = fetch_block(get_block, cid, "record-hash")
    if len(data) > MAX_RECORD:
        raise SpecAuditError("record-format", f"the {what} is over 4 MiB")
    try:
        node = cbor_decode(data)
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, struct.error) as exc:
        raise SpecAuditError("record-format", f"the {what} is not DAG-CBOR: {exc}") from None
    if not isinstance(node, dict) or cbor_encode(node) != data:
        raise SpecAuditError("record-format", f"the {what} is not canonical DAG-CBOR")
    return node


def check_signature(node: dict[str, Any], what: str) -> None:
    """§5.2, §9.2, §9.3: ``sig`` is the coordinator's over the node without ``sig``."""
    try:
        key = public_key(node["coordinator"])
    except (ValueError, TypeError) as exc:
        raise SpecAuditError("record-format", f"the {what}'s coordinator: {exc}") from None
    unsigned = {k: v for k, v in node.items() if k != "sig"}
    if not isinstance(node["sig"], bytes) or not ed25519_verify(
        key, cbor_encode(unsigned), node["sig"]
    ):
        raise SpecAuditError("record-signature", f"the {what} is not signed by its coordinator")


def check_inputs(node: dict[str, Any]) -> None:
    """§5.2: the input maps of the node's version, sorted by peer, no peer twice."""
    keys = INPUT_KEYS[node["type"]]
    if not isinstance(node["inputs"], list):
        raise SpecAuditError("record-format", "inputs is not an array")
    for item in node["inputs"]:
        if (
            not isinstance(item, dict)
            or set(item) != keys
            or not isinstance(item["weight"], float)
            or not isinstance(item["gradient"], Link)
        ):
            raise SpecAuditError("record-format", f"an input is not a {node['type']} input")
    peers = [i["peer"] for i in node["inputs"]]
    if peers != sorted(set(peers)):
        raise SpecAuditError("record-format", "inputs are not sorted by peer, each once")


def check_round_node(node: dict[str, Any]) -> None:
    """§5.2: a round/2, round/3 or round/4 node (exact keys), signed by its coordinator."""
    if set(node) != ROUND_KEYS or node["type"] not in (ROUND2, ROUND3, ROUND4):
        raise SpecAuditError("record-format", f"keys {sorted(node)}, type {node.get('type')!r}")
    check_inputs(node)
    check_signature(node, "round record")


def check_step_node(node: dict[str, Any]) -> None:
    """§9.2: a gradstore/step/1 node: round/4's keys without ``prev``, with the step's name
    and selectors, at least one input; signed by its coordinator."""
    if set(node) != STEP_KEYS or node["type"] != STEP1:
        raise SpecAuditError("record-format", f"keys {sorted(node)}, type {node.get('type')!r}")
    if not isinstance(node["step"], str) or not _NAME.fullmatch(node["step"]):
        raise SpecAuditError("record-format", f"step name {node['step']!r}")
    selectors = node["tensors"]
    if (
        not isinstance(selectors, list)
        or not selectors
        or not all(selector_ok(s) for s in selectors)
        or len(set(selectors)) != len(selectors)
    ):
        raise SpecAuditError("record-format", f"tensors {selectors!r} are not selectors")
    check_inputs(node)
    if not node["inputs"]:
        raise SpecAuditError("record-format", "a step record lists at least one input")
    check_signature(node, "step record")


def check_round5_node(node: dict[str, Any]) -> None:
    """§9.3: a gradstore/round/5 node: a map per step (closed with its record and output
    links, or failed with a reason), each name once, at least one closed; signed."""
    if set(node) != ROUND5_KEYS or node["type"] != ROUND5:
        raise SpecAuditError("record-format", f"keys {sorted(node)}, type {node.get('type')!r}")
    steps = node["steps"]
    if not isinstance(steps, list):
        raise SpecAuditError("record-format", "steps is not an array")
    for entry in steps:
        # a step another coordinator owns names it (never the record's own coordinator)
        owned = isinstance(entry, dict) and "coordinator" in entry
        if owned and (
            not isinstance(entry["coordinator"], str) or entry["coordinator"] == node["coordinator"]
        ):
            raise SpecAuditError("record-format", f"a step entry's owner {entry!r:.100}")
        keys = set(entry) - {"coordinator"} if isinstance(entry, dict) else set()
        closed = (
            isinstance(entry, dict)
            and keys == {"step", "record", "output"}
            and isinstance(entry["record"], Link)
            and isinstance(entry["output"], Link)
            and cid_parts(entry["record"].cid)[1] == DAG_CBOR
        )
        failed = (
            isinstance(entry, dict)
            and keys == {"step", "failed"}
            and isinstance(entry["failed"], str)
            and entry["failed"] != ""
        )
        if not (closed or failed) or not _NAME.fullmatch(str(entry["step"])):
            raise SpecAuditError("record-format", f"a step entry {entry!r:.100}")
    names = [e["step"] for e in steps]
    if len(set(names)) != len(names) or all("failed" in e for e in steps):
        raise SpecAuditError("record-format", "steps: a name twice, or no step closed")
    prev = node["prev"]
    if not isinstance(node["output"], Link) or not (
        prev is None or (isinstance(prev, Link) and cid_parts(prev.cid)[1] == DAG_CBOR)
    ):
        raise SpecAuditError("record-format", "output or prev is not a link")
    check_signature(node, "round record")


def fetch_record(get_block: GetBlock, record_cid: str) -> dict[str, Any]:
    """§5: a round/2-4 record, hash- and signature-checked, in canonical DAG-CBOR."""
    node = fetch_node(get_block, parse_cid(record_cid), "round record")
    check_round_node(node)
    return node


def method_plan(
    record: dict[str, Any], n: int
) -> tuple[list[float] | None, float, tuple[int, int] | None]:
    """§6.4, §6.5: (linear coefficients, divisor) or the order-statistic rows."""
    method, params = record["method"], record["params"]
    samples = [i["num_samples"] for i in record["inputs"]]
    if method == "sum":
        return [1.0] * n, 1.0, None
    if method == "mean":
        return [1.0] * n, float(n), None
    if method == "fedavg":
        return [float(c) for c in samples], float(sum(samples)), None
    if method == "weighted":
        weights = [float(w) for w in params["weights"]]
        return weights, math.fsum(weights), None
    if method == "median":
        return None, 0.0, ((n - 1) // 2, n // 2 + 1)
    if method == "trimmed_mean":
        k = trimmed_per_side(n, float(params["trim_ratio"]))
        return None, 0.0, (k, n - k)
    raise SpecAuditError("params", f"unknown method {method!r}")


def expected_weights(
    record: dict[str, Any], n: int, selected: tuple[int, ...] | None
) -> list[float]:
    """§7: the weight each input's entry must carry."""
    method = record["method"]
    if method in ("krum", "multikrum"):
        assert selected is not None
        return [1.0 / len(selected) if i in selected else 0.0 for i in range(n)]
    if method in ("median", "trimmed_mean"):
        return [1.0] * n
    coefs, divisor, _ = method_plan(record, n)
    assert coefs is not None
    return [c / divisor for c in coefs]


def audit_round(get_block: GetBlock, record_cid: str) -> Audit | SteppedAudit:
    """Re-derive the round of ``record_cid``: a round/2-4 record's output (docs/spec.md §5-§7),
    or a round/5 record's steps and model-level document (§9). SpecAuditError names a check."""
    node = fetch_node(get_block, parse_cid(record_cid), "round record")
    if node.get("type") == ROUND5:
        return audit_stepped(get_block, node)
    check_round_node(node)
    return rederive(get_block, node)


def aggregate_meta(record: dict[str, Any]) -> dict[str, Any]:
    """§6.10: the aggregate's meta; a step's aggregate also names its step (§9.4)."""
    meta = {
        "inputs": [cid_text(as_v1(i["gradient"].cid)) for i in record["inputs"]],
        "job": record["job"], "kind": "aggregate", "method": record["method"],
        "round": record["round"], "run": record["run"],
    }  # fmt: skip
    if record["type"] == STEP1:
        meta["step"] = record["step"]
    return meta


def rederive(get_block: GetBlock, record: dict[str, Any]) -> Audit:
    """Re-derive a checked round/2-4 record's or step record's output (§4-§7, §9.2, §9.4)."""
    version, params, inputs = record["type"], record["params"], record["inputs"]
    step = record.get("step") if version == STEP1 else None
    n = len(inputs)
    if n == 0:
        raise SpecAuditError("inputs", "the record lists no input")
    if version in SIGNED:  # §4: each count (and a step record's step) is the peer's own word
        for item in inputs:
            text = cid_text(as_v1(item["gradient"].cid))
            message = announcement_bytes(
                record["job"], record["run"], record["round"], item["peer"], text,
                item["num_samples"], item["sent_at"], step,
            )  # fmt: skip
            if not ed25519_verify(public_key(item["peer"]), message, item["peer_sig"]):
                raise SpecAuditError("input-signature", f"{item['peer']} did not sign {text}")
    docs = []
    for item in inputs:
        data = read_file(get_block, item["gradient"].cid, "input-blocks")
        try:
            doc = decode_document(data)
        except (ValueError, KeyError, UnicodeDecodeError) as exc:
            raise SpecAuditError("input-decode", str(exc)) from None
        if version != ROUND2 and item["codec"] != doc.codec:
            raise SpecAuditError("input-codec", f"{item['codec']} != {doc.codec}")
        if "num_samples" in doc.meta and doc.meta["num_samples"] != item["num_samples"]:
            raise SpecAuditError("input-samples", f"{item['peer']}")
        if version in SIGNED:  # §7
            own = {"job": record["job"], "run": record["run"], "round": record["round"],
                   "peer": item["peer"]}  # fmt: skip
            if step is not None:
                own["step"] = step
            for key, value in own.items():
                if key in doc.meta and doc.meta[key] != value:
                    raise SpecAuditError("input-meta", f"{item['peer']}: {key}")
        if step is not None:  # §9.2: the document holds exactly the step's tensors
            names = [t.name for t in doc.tensors]
            check_step_tensors(record["tensors"], names, f"the input of {item['peer']}")
        docs.append(doc)
    layout = [(t.name, t.dtype, t.shape) for t in docs[0].tensors]
    if any([(t.name, t.dtype, t.shape) for t in d.tensors] != layout for d in docs):
        raise SpecAuditError("aggregate", "the inputs' tensors differ")
    if any(dtype not in FLOATS for _, dtype, _ in layout):
        raise SpecAuditError("aggregate", "only float tensors are aggregated")
    per_tensor = [[tensor_values(d, t) for t in d.tensors] for d in docs]  # §6.1
    xs = [[v for t in tensors for v in t] for tensors in per_tensor]

    scales = [1.0] * n  # §6.3
    clip_in = params.get("clip_input_norm")
    if clip_in is not None:
        for i in range(n):
            norm = gradient_norm(per_tensor[i], version)
            scales[i] = 1.0 if norm <= clip_in else clip_in / norm

    method = record["method"]
    selected = None
    order_stat = method in ("median", "trimmed_mean")
    if method in ("krum", "multikrum"):  # §6.6
        f = params["byzantine"]
        m = 1 if method == "krum" else params.get("select") or n - f
        ys = [[x * scales[i] for x in xs[i]] for i in range(n)]
        recorded = tuple(i for i, item in enumerate(inputs) if item["weight"] != 0.0)
        selected = krum_selection(ys, f, m, recorded)
        wide = linear([xs[i] for i in selected], [scales[i] for i in selected], float(m))
    elif order_stat:
        _, _, rows = method_plan(record, n)
        assert rows is not None
        ys = [[x * scales[i] for x in xs[i]] for i in range(n)]
        wide = order_statistic(ys, *rows)
    else:
        coefs, divisor, _ = method_plan(record, n)
        assert coefs is not None
        add = linear_exact if params.get("accumulate") == "exact" else linear
        wide = add(xs, [c * s for c, s in zip(coefs, scales, strict=True)], divisor)

    for item, want in zip(inputs, expected_weights(record, n, selected), strict=True):  # §7
        if item["weight"] != want:
            raise SpecAuditError("input-weight", f"{item['peer']}: {item['weight']} != {want}")

    sizes = [math.prod(shape) for _, _, shape in layout]
    dtypes = [dtype for (_, dtype, _), size in zip(layout, sizes, strict=True) for _ in range(size)]
    clip_out = params.get("clip_output_norm")
    if clip_out is None:
        values = [round_to(d, v) for d, v in zip(dtypes, wide, strict=True)]
    elif version in SIGNED:  # §6.8: the norm of the binary64 values, one rounding
        norm = norm_sequential(wide)
        s = 1.0 if norm <= clip_out else clip_out / norm
        values = [round_to(d, v * s) for d, v in zip(dtypes, wide, strict=True)]
    else:  # §6.8, round/2 and round/3: rounded, then scaled and rounded again
        rounded = [round_to(d, v) for d, v in zip(dtypes, wide, strict=True)]
        if order_stat:
            rounded = [0.0 if v == 0 else v for v in rounded]
        pieces, at = [], 0
        for size in sizes:
            pieces.append(rounded[at : at + size])
            at += size
        norm = norm_blocked_pairwise(pieces)
        s = 1.0 if norm <= clip_out else clip_out / norm
        values = (
            rounded
            if s == 1.0
            else [round_to(d, v * s) for d, v in zip(dtypes, rounded, strict=True)]
        )
    if order_stat and (clip_out is None or version in SIGNED):
        values = [0.0 if v == 0 else v for v in values]  # §6.5: never -0.0
    if any(math.isnan(v) or math.isinf(v) for v in values):
        raise SpecAuditError("aggregate", "the aggregate overflows its dtype")

    meta = aggregate_meta(record)
    tensors, documents, at = {}, [], 0
    for (name, dtype, shape), size in zip(layout, sizes, strict=True):
        part = values[at : at + size]
        at += size
        tensors[name] = (dtype, shape, part)
        documents.append((name, dtype, shape, encode_floats(dtype, part)))
    output = file_cid(encode_document(meta, documents))
    if output != as_v1(record["output"].cid):
        raise SpecAuditError(
            "output-cid",
            f"the record names {cid_text(as_v1(record['output'].cid))}, the inputs give "
            f"{cid_text(output)}",
        )
    return Audit(record, output, tensors, selected)


def audit_stepped(get_block: GetBlock, node: dict[str, Any]) -> SteppedAudit:
    """§9.3-§9.4: a round/5 record (keys, signature), each closed step's record fetched,
    linked (``step-link``) and re-derived as a round/4 record with the step's rules, then
    the model-level document laid out from the steps' aggregates and its CID compared."""
    check_round5_node(node)
    steps: dict[str, Audit] = {}
    failed: dict[str, str] = {}
    owner: dict[str, str] = {}
    parts: list[tuple[str, str, tuple[int, ...], bytes]] = []
    outputs: list[str] = []
    for entry in node["steps"]:
        name = entry["step"]
        if "failed" in entry:
            failed[name] = entry["failed"]
            continue
        step = fetch_node(get_block, entry["record"].cid, "step record")
        check_step_node(step)
        if step["coordinator"] != entry.get("coordinator", node["coordinator"]):
            raise SpecAuditError("step-owner", f"step {name}'s record is not its owner's")
        for key in ("job", "run", "round"):
            if step[key] != node[key]:
                raise SpecAuditError("step-link", f"step {name}'s record has another {key}")
        if step["step"] != name:
            raise SpecAuditError("step-link", f"the round links step {step['step']!r} as {name!r}")
        if step["output"] != entry["output"]:
            raise SpecAuditError("step-link", f"step {name}'s output is not the round's")
        steps[name] = rederive(get_block, step)
        # §9.4: the aggregate as stored (its CID is the step record's output, just re-derived)
        try:
            aggregate = decode_document(read_file(get_block, entry["output"].cid, "output-blocks"))
        except (ValueError, KeyError, UnicodeDecodeError) as exc:
            raise SpecAuditError("model-output", f"step {name}'s aggregate: {exc}") from None
        names = [t.name for t in aggregate.tensors]
        check_step_tensors(step["tensors"], names, f"step {name}'s output")
        for t in aggregate.tensors:
            if t.name in owner:
                raise SpecAuditError(
                    "step-tensors", f"{t.name!r} is in steps {owner[t.name]!r} and {name!r}"
                )
            owner[t.name] = name
            parts.append((t.name, t.dtype, t.shape, bytes(t.data)))
        outputs.append(cid_text(as_v1(entry["output"].cid)))
    meta = model_meta(node, list(steps), outputs)
    model = file_cid(model_document(meta, parts))
    if model != as_v1(node["output"].cid):
        raise SpecAuditError(
            "model-output",
            f"the record names {cid_text(as_v1(node['output'].cid))}, its steps' aggregates "
            f"give {cid_text(model)}",
        )
    order = sorted(owner, key=lambda n: n.encode("utf-8"))
    return SteppedAudit(node, model, steps, failed, meta, order)


def model_meta(node: dict[str, Any], closed: list[str], outputs: list[str]) -> dict[str, Any]:
    """§9.4: the model-level document's meta: the closed steps (record order) and their
    aggregates' CIDs (base32 CIDv1 text)."""
    return {
        "job": node["job"], "kind": "model", "outputs": outputs, "round": node["round"],
        "run": node["run"], "steps": closed,
    }  # fmt: skip


def model_document(
    meta: dict[str, Any], parts: Sequence[tuple[str, str, tuple[int, ...], bytes]]
) -> bytes:
    """§9.4: the model-level document: the steps' tensors, copied, sorted by name (§2.2)."""
    return encode_document(meta, parts)


def exact_sum(values: Sequence[float]) -> Fraction:
    """The exact sum of binary64 values (for tests of the rounding rules)."""
    return sum((Fraction(v) for v in values), Fraction(0))
