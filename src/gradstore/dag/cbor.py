"""DAG-CBOR, the one door to it: round records, lists blocks, CAR headers, dag-cbor links.

A strict codec for the subset gradstore writes: maps with text keys in DAG-CBOR's
canonical order (shorter first, then bytewise), integers in [-2**64, 2**64), finite
64-bit floats, text, bytes, arrays, null, booleans, and tag-42 links, which are this
package's ``CID``. ``encode`` gives the bytes the dag-cbor reference gives; ``decode``
accepts what the reference accepts for that subset, except links outside the CID profile
and nesting deeper than ``max_depth``, and refuses everything else with a ``DAGError``
naming the byte: indefinite lengths, non-minimal integers and lengths, unsorted or
repeated keys, other tags and simple values, NaN and infinities, 16- and 32-bit floats,
trailing bytes. Every length is checked against the bytes left before anything is built.

Why not the ``dag_cbor`` library: it validates the runtime type of every value and CID it
touches, which made a 1,000-input round record take seconds to decode and a 4 MiB one
minutes, before any check could refuse it (docs/design/records.md, "The DAG-CBOR codec").
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any, Final, TypeAlias

from ..errors import CIDError, DAGError
from .cid import CID, DAG_CBOR, DAG_PB, RAW, SHA2_256, SHA2_256_LEN

#: Containers nested deeper than this are refused (a record nests about 20 deep at most).
MAX_DEPTH: Final = 64

_TAG_CID: Final = 42
_PROFILE_CODECS: Final = frozenset((RAW, DAG_PB, DAG_CBOR))
_LINK_PREFIX: Final = b"\xd8\x2a"  # tag 42, minimally encoded
_CID_V1_LEN: Final = 1 + 1 + 1 + 2 + SHA2_256_LEN  # 0x00 prefix, version, codec, multihash
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">L")
_U64: Final = struct.Struct(">Q")
_F64: Final = struct.Struct(">d")
_HEAD_U8: Final = struct.Struct(">BB")
_HEAD_U16: Final = struct.Struct(">BH")
_HEAD_U32: Final = struct.Struct(">BL")
_HEAD_U64: Final = struct.Struct(">BQ")
_HEAD_F64: Final = struct.Struct(">Bd")
#: Everything a CIDv1 link holds before its digest, by codec: tag, byte-string head, 0x00
#: multibase prefix, version, codec, sha2-256 multihash head.
_LINK_V1_HEADS: Final = {
    codec: _LINK_PREFIX + bytes((0x58, _CID_V1_LEN, 0x00, 0x01, codec, SHA2_256, SHA2_256_LEN))
    for codec in _PROFILE_CODECS
}
_SMALL: Final = tuple(tuple(bytes((major << 5 | n,)) for n in range(24)) for major in range(8))
_FALSE, _TRUE, _NULL = b"\xf4", b"\xf5", b"\xf6"
_INT_LIMIT: Final = 1 << 64


def _fail(message: str, at: int | None = None) -> DAGError:
    return DAGError(f"not DAG-CBOR: {message}" + ("" if at is None else f" at byte {at}"))


# --- encoding ----------------------------------------------------------------------------------


class _Unencodable(Exception):
    """A value outside the subset; ``path`` is filled in (innermost first) on the way out."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what
        self.path: list[str] = []


def encode(value: object, *, max_depth: int = MAX_DEPTH) -> bytes:
    """The DAG-CBOR bytes of ``value`` (exactly the reference's); DAGError outside the subset."""
    out = bytearray()
    try:
        _encode(value, out, max_depth)
    except _Unencodable as exc:
        raise _fail(f"{exc.what} at ${''.join(reversed(exc.path))}") from None
    return bytes(out)


def _head(major: int, n: int) -> bytes:
    if n < 24:
        return _SMALL[major][n]
    first = major << 5
    if n < 0x100:
        return _HEAD_U8.pack(first | 24, n)
    if n < 0x10000:
        return _HEAD_U16.pack(first | 25, n)
    if n < 0x100000000:
        return _HEAD_U32.pack(first | 26, n)
    return _HEAD_U64.pack(first | 27, n)


def _encode(value: object, out: bytearray, depth: int) -> None:
    encoder = _ENCODERS.get(type(value))
    if encoder is None:
        encoder = _encoder_of(value)
    encoder(value, out, depth)


def _encoder_of(value: object) -> _Encoder:
    # Subclasses (IntEnum, StrEnum, ...) go where the reference's isinstance chain sends them.
    for kind in (bool, int, bytes, str, list, dict, CID, float):
        if isinstance(value, kind):
            return _ENCODERS[kind]
    raise _Unencodable(f"{type(value).__name__} is not a DAG-CBOR kind")


def _encode_bool(value: bool, out: bytearray, depth: int) -> None:
    out += _TRUE if value else _FALSE


def _encode_none(value: None, out: bytearray, depth: int) -> None:
    out += _NULL


def _encode_int(value: int, out: bytearray, depth: int) -> None:
    if not -_INT_LIMIT <= value < _INT_LIMIT:
        raise _Unencodable(f"integer {value} does not fit in 64 bits")
    out += _head(0, value) if value >= 0 else _head(1, -1 - value)


def _encode_float(value: float, out: bytearray, depth: int) -> None:
    if not math.isfinite(value):
        raise _Unencodable(f"float {value!r} (DAG-CBOR floats are finite)")
    out += _HEAD_F64.pack(0xFB, value)


def _encode_bytes(value: bytes, out: bytearray, depth: int) -> None:
    out += _head(2, len(value))
    out += value


def _utf8(value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _Unencodable(f"text that is not UTF-8 ({exc.reason})") from None


def _encode_str(value: str, out: bytearray, depth: int) -> None:
    raw = _utf8(value)
    out += _head(3, len(raw))
    out += raw


def _encode_list(value: list[Any], out: bytearray, depth: int) -> None:
    if depth <= 0:
        raise _Unencodable("arrays and maps nested deeper than the bound")
    out += _head(4, len(value))
    for i, item in enumerate(value):
        try:
            _encode(item, out, depth - 1)
        except _Unencodable as exc:
            exc.path.append(f"[{i}]")
            raise


def _key_order(pair: tuple[object, bytes]) -> tuple[int, bytes]:
    return len(pair[1]), pair[1]


def _plan(keys: tuple[object, ...]) -> tuple[tuple[Any, bytes], ...]:
    """A map's keys in canonical order, each with its encoding (head and UTF-8)."""
    pairs = []
    for key in keys:
        if not isinstance(key, str):
            raise _Unencodable(f"map key {key!r:.40} (keys are text)")
        pairs.append((key, _utf8(key)))
    pairs.sort(key=_key_order)
    plan = tuple((key, _head(3, len(raw)) + raw) for key, raw in pairs)
    if len(keys) <= _PLANNED_KEYS:  # the same few shapes recur: every input of a record
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[keys] = plan
    return plan


#: Key plans of small maps, by their keys in insertion order.
_PLANS: Final[dict[tuple[object, ...], tuple[tuple[Any, bytes], ...]]] = {}
_PLANNED_KEYS: Final = 16
_MAX_PLANS: Final = 256


def _encode_dict(value: dict[Any, Any], out: bytearray, depth: int) -> None:
    if depth <= 0:
        raise _Unencodable("arrays and maps nested deeper than the bound")
    keys = tuple(value)
    plan = _PLANS.get(keys) or _plan(keys)
    out += _head(5, len(plan))
    for key, encoded in plan:
        out += encoded
        try:
            _encode(value[key], out, depth - 1)
        except _Unencodable as exc:
            exc.path.append(f".{key}")
            raise


def _encode_cid(value: CID, out: bytearray, depth: int) -> None:
    if value.version == 1:  # the profile's codecs are one-byte varints
        out += _LINK_V1_HEADS[value.codec]
        out += value.digest
        return
    raw = value.bytes
    out += _LINK_PREFIX
    out += _head(2, len(raw) + 1)
    out += b"\x00"
    out += raw


_Encoder: TypeAlias = Callable[[Any, bytearray, int], None]
_ENCODERS: Final[dict[type[Any], _Encoder]] = {
    bool: _encode_bool,
    int: _encode_int,
    bytes: _encode_bytes,
    str: _encode_str,
    list: _encode_list,
    dict: _encode_dict,
    CID: _encode_cid,
    type(None): _encode_none,
    float: _encode_float,
}


# --- decoding ----------------------------------------------------------------------------------


def decode(data: bytes | bytearray | memoryview, *, max_depth: int = MAX_DEPTH) -> Any:
    """The one value ``data`` encodes (links as ``CID``); DAGError unless it is strict DAG-CBOR."""
    buf: bytes | memoryview = data if isinstance(data, bytes) else memoryview(data).cast("B")
    value, pos = _item(buf, 0, len(buf), max_depth)
    if pos != len(buf):
        raise _fail(f"{len(buf) - pos} trailing bytes after the value", pos)
    return value


def _item(buf: bytes | memoryview, pos: int, end: int, depth: int) -> tuple[Any, int]:
    """The value at ``pos`` and the offset after it."""
    if pos >= end:
        raise _fail("truncated, a value is missing", pos)
    initial = buf[pos]
    if initial < 24:  # the commonest item: a small unsigned integer
        return initial, pos + 1
    start = pos
    major = initial >> 5
    info = initial & 0x1F
    pos += 1
    if info < 24:
        arg = info
    else:
        if info > 27:
            what = "an indefinite length" if info == 31 else f"reserved additional info {info}"
            raise _fail(what, start)
        if major == 7 and info != 27:
            raise _fail("a float that is not 64-bit, or a simple value over 23", start)
        width = 1 << (info - 24)
        if pos + width > end:
            raise _fail("truncated head", start)
        if info == 24:
            arg = buf[pos]
            minimum = 24
        elif info == 25:
            arg = _U16.unpack_from(buf, pos)[0]
            minimum = 0x100
        elif info == 26:
            arg = _U32.unpack_from(buf, pos)[0]
            minimum = 0x10000
        elif major == 7:
            number: float = _F64.unpack_from(buf, pos)[0]
            if not math.isfinite(number):
                raise _fail(f"float {number!r} (DAG-CBOR floats are finite)", start)
            return number, pos + 8
        else:
            arg = _U64.unpack_from(buf, pos)[0]
            minimum = 0x100000000
        if arg < minimum:
            raise _fail(f"{arg} is not minimally encoded", start)
        pos += width
    if major == 0:
        return arg, pos
    if major == 1:
        return -1 - arg, pos
    if major == 2:
        if arg > end - pos:
            raise _fail(f"byte string of {arg} bytes runs past the end", start)
        return bytes(buf[pos : pos + arg]), pos + arg
    if major == 3:
        if arg > end - pos:
            raise _fail(f"text of {arg} bytes runs past the end", start)
        return _text(buf[pos : pos + arg], start), pos + arg
    if major == 4:
        if depth <= 0:
            raise _fail("arrays and maps nest deeper than the bound", start)
        if arg > end - pos:  # every item takes at least one byte
            raise _fail(f"array of {arg} items runs past the end", start)
        items = []
        for _ in range(arg):
            item, pos = _item(buf, pos, end, depth - 1)
            items.append(item)
        return items, pos
    if major == 5:
        if depth <= 0:
            raise _fail("arrays and maps nest deeper than the bound", start)
        return _map(buf, pos, end, depth - 1, arg, start)
    if major == 6:
        if arg != _TAG_CID:
            raise _fail(f"tag {arg} (DAG-CBOR has tag 42 only)", start)
        if pos >= end or buf[pos] >> 5 != 2:
            raise _fail("tag 42 must hold a byte string", start)
        raw, pos = _item(buf, pos, end, depth)
        return _link(raw, start), pos
    if arg == 20:
        return False, pos
    if arg == 21:
        return True, pos
    if arg == 22:
        return None, pos
    raise _fail(f"simple value {arg} (DAG-CBOR has false, true and null)", start)


def _text(raw: bytes | memoryview, at: int) -> str:
    try:
        return raw.decode() if type(raw) is bytes else str(raw, "utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(f"text is not UTF-8 ({exc.reason})", at) from None


def _map(
    buf: bytes | memoryview, pos: int, end: int, depth: int, count: int, start: int
) -> tuple[dict[str, Any], int]:
    if count > (end - pos) // 2:  # every entry takes at least two bytes
        raise _fail(f"map of {count} entries runs past the end", start)
    out: dict[str, Any] = {}
    previous = b""
    for i in range(count):
        at = pos
        if pos >= end:
            raise _fail("truncated, a map key is missing", at)
        initial = buf[pos]
        key: str | None = None
        if 0x60 <= initial < 0x78:  # text of up to 23 bytes: every key gradstore writes
            length = initial - 0x60
            pos += 1
            if length > end - pos:
                raise _fail(f"key of {length} bytes runs past the end", at)
            raw = buf[pos : pos + length]
            if type(raw) is not bytes:  # a memoryview's slice, for the comparisons below
                raw = bytes(raw)
            pos += length
        elif initial >> 5 == 3:
            key, pos = _item(buf, pos, end, 0)  # the head's checks, bounds and UTF-8
            raw = key.encode("utf-8")
        else:
            raise _fail("map keys must be text", at)
        if i and (len(raw) < len(previous) or (len(raw) == len(previous) and raw <= previous)):
            raise _fail("map keys are repeated or not in canonical order", at)
        previous = raw
        if key is None:
            key = _text(raw, at)
        out[key], pos = _item(buf, pos, end, depth)
    return out, pos


def _link(raw: bytes, at: int) -> CID:
    if (
        len(raw) == _CID_V1_LEN
        and raw[0] == 0
        and raw[1] == 1
        and raw[2] in _PROFILE_CODECS
        and raw[3] == SHA2_256
        and raw[4] == SHA2_256_LEN
    ):
        return CID(raw[2], raw[5:], 1)
    if not raw or raw[0] != 0:
        raise _fail("a link must start with the 0x00 multibase prefix", at)
    try:
        cid = CID.from_bytes(raw[1:])
    except CIDError as exc:
        raise _fail(f"link outside the CID profile ({exc})", at) from None
    if cid.bytes != raw[1:]:
        raise _fail("link is not a canonical binary CID", at)
    return cid
