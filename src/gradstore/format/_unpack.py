"""A strict msgpack cursor: smallest encodings only, no float32, no ext, bounded reads.

It walks a memoryview without copying; ``head()`` reads one type byte and its
fixed-size argument, so callers see declared lengths before touching payloads.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final

from ..errors import LimitExceededError, MalformedDocumentError
from ._paths import PathError

NIL: Final = "nil"
BOOL: Final = "bool"
INT: Final = "int"
FLOAT: Final = "float"
STR: Final = "str"
BIN: Final = "bin"
ARRAY: Final = "array"
MAP: Final = "map"

# type byte -> (kind, argument struct, smallest allowed, largest allowed, msgpack name)
_WIDE: Final[dict[int, tuple[str, struct.Struct, float, float, str]]] = {
    0xC4: (BIN, struct.Struct(">B"), 0, 0xFF, "bin8"),
    0xC5: (BIN, struct.Struct(">H"), 0x100, 0xFFFF, "bin16"),
    0xC6: (BIN, struct.Struct(">I"), 0x10000, 0xFFFFFFFF, "bin32"),
    0xCB: (FLOAT, struct.Struct(">d"), -math.inf, math.inf, "float64"),
    0xCC: (INT, struct.Struct(">B"), 0x80, 0xFF, "uint8"),
    0xCD: (INT, struct.Struct(">H"), 0x100, 0xFFFF, "uint16"),
    0xCE: (INT, struct.Struct(">I"), 0x10000, 0xFFFFFFFF, "uint32"),
    0xCF: (INT, struct.Struct(">Q"), 1 << 32, (1 << 64) - 1, "uint64"),
    0xD0: (INT, struct.Struct(">b"), -0x80, -33, "int8"),
    0xD1: (INT, struct.Struct(">h"), -0x8000, -0x81, "int16"),
    0xD2: (INT, struct.Struct(">i"), -0x80000000, -0x8001, "int32"),
    0xD3: (INT, struct.Struct(">q"), -(1 << 63), -0x80000001, "int64"),
    0xD9: (STR, struct.Struct(">B"), 32, 0xFF, "str8"),
    0xDA: (STR, struct.Struct(">H"), 0x100, 0xFFFF, "str16"),
    0xDB: (STR, struct.Struct(">I"), 0x10000, 0xFFFFFFFF, "str32"),
    0xDC: (ARRAY, struct.Struct(">H"), 16, 0xFFFF, "array16"),
    0xDD: (ARRAY, struct.Struct(">I"), 0x10000, 0xFFFFFFFF, "array32"),
    0xDE: (MAP, struct.Struct(">H"), 16, 0xFFFF, "map16"),
    0xDF: (MAP, struct.Struct(">I"), 0x10000, 0xFFFFFFFF, "map32"),
}
_REFUSED: Final = {
    0xC1: "the never-used msgpack byte 0xc1",
    0xCA: "a float32 (gradstore/1 floats are float64)",
    **{b: "a msgpack ext type" for b in (0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8)},
}


class Reader:
    """A position in ``buf``; reads may not pass ``end``.

    When ``limit`` is set, ``end`` is a caller's limit rather than the end of
    the data, and passing it raises LimitExceededError with that message.
    """

    __slots__ = ("buf", "end", "limit", "pos")

    def __init__(self, buf: memoryview, pos: int, end: int, limit: str | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end
        self.limit = limit

    def take(self, n: int) -> int:
        """Skip ``n`` bytes and return where they start (nothing is copied)."""
        start = self.pos
        if start + n > self.end:
            if self.limit is not None:
                raise LimitExceededError(self.limit, "max_meta_bytes")
            raise MalformedDocumentError(
                f"truncated: {n} bytes needed, {self.end - start} left", start
            )
        self.pos = start + n
        return start

    def head(self) -> tuple[str, Any]:
        """Read a type byte and its argument: the value (nil/bool/int/float) or a length/count."""
        start = self.take(1)
        b = self.buf[start]
        if b < 0x80:
            return INT, b
        if b >= 0xE0:
            return INT, b - 0x100
        if b < 0x90:
            return MAP, b & 0x0F
        if b < 0xA0:
            return ARRAY, b & 0x0F
        if b < 0xC0:
            return STR, b & 0x1F
        if b == 0xC0:
            return NIL, None
        if b == 0xC2 or b == 0xC3:
            return BOOL, b == 0xC3
        wide = _WIDE.get(b)
        if wide is None:
            raise MalformedDocumentError(f"not canonical: {_REFUSED[b]}", start)
        kind, st, lo, hi, name = wide
        at = self.take(st.size)
        (arg,) = st.unpack_from(self.buf, at)
        if kind is not FLOAT and not lo <= arg <= hi:
            raise MalformedDocumentError(
                f"not canonical: {arg} written as {name}, msgpack's smallest form is shorter", start
            )
        return kind, arg

    def text(self, n: int) -> str:
        """Read ``n`` bytes of UTF-8."""
        at = self.take(n)
        try:
            return str(self.buf[at : at + n], "utf-8")
        except UnicodeDecodeError as e:
            raise MalformedDocumentError(
                f"str is not valid UTF-8: {e.reason}", at + e.start
            ) from None

    def value(self, depth: int, max_depth: int) -> Any:
        """One whole value as Python objects (meta rules: finite floats, sorted str keys).

        Content errors raise PathError (the caller adds the path); depth over
        ``max_depth`` raises LimitExceededError. Counts are never used to preallocate.
        """
        kind, arg = self.head()
        if kind is FLOAT:
            if not math.isfinite(arg):
                raise PathError(f"meta floats must be finite, got {arg}")
            return arg
        if kind is STR:
            return self.text(arg)
        if kind is BIN:
            at = self.take(arg)
            return bytes(self.buf[at : at + arg])
        if kind is ARRAY:
            _check_depth(depth, max_depth)
            items = []
            for i in range(arg):
                try:
                    items.append(self.value(depth + 1, max_depth))
                except PathError as e:
                    e.segments.append(i)
                    raise
            return items
        if kind is MAP:
            _check_depth(depth, max_depth)
            return self.map_body(arg, depth, max_depth)
        return arg  # nil, bool, int

    def map_body(self, count: int, depth: int, max_depth: int) -> dict[str, Any]:
        """The ``count`` pairs of a map whose header was read; str keys in UTF-8 byte order."""
        out: dict[str, Any] = {}
        prev: bytes | None = None
        for _ in range(count):
            kind, n = self.head()
            if kind is not STR:
                raise PathError(f"map keys must be str, found {kind}")
            at = self.pos
            key = self.text(n)
            raw = bytes(self.buf[at : at + n])
            if prev is not None and raw <= prev:
                word = "duplicate key" if raw == prev else "keys not sorted by UTF-8 bytes at"
                raise PathError(f"{word} {key!r}")
            prev = raw
            try:
                out[key] = self.value(depth + 1, max_depth)
            except PathError as e:
                e.segments.append(key)
                raise
        return out


def _check_depth(depth: int, max_depth: int) -> None:
    if depth > max_depth:
        raise LimitExceededError(
            f"meta nests deeper than max_meta_depth={max_depth}", "max_meta_depth"
        )
