"""Smallest-form msgpack writers (what ``msgpack.packb(use_bin_type=True)`` emits) and meta packing.

The document header is written by hand from these small pieces, so tensor data
never passes through a general-purpose packer.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..errors import InvalidDocumentError
from ._limits import DEFAULT_LIMITS
from ._paths import PathError, render

#: Nesting the encoder accepts in meta: what a default decoder accepts.
MAX_META_DEPTH = DEFAULT_LIMITS.max_meta_depth

_U8 = struct.Struct(">BB")
_U16 = struct.Struct(">BH")
_U32 = struct.Struct(">BI")
_U64 = struct.Struct(">BQ")
_I8 = struct.Struct(">Bb")
_I16 = struct.Struct(">Bh")
_I32 = struct.Struct(">Bi")
_I64 = struct.Struct(">Bq")
_F64 = struct.Struct(">Bd")


def pack_int(v: int) -> bytes:
    """The smallest msgpack encoding of ``v`` (unsigned forms for v >= 0, as msgpack does)."""
    if v >= 0:
        if v < 0x80:
            return bytes((v,))
        if v < 0x100:
            return _U8.pack(0xCC, v)
        if v < 0x10000:
            return _U16.pack(0xCD, v)
        if v < 0x100000000:
            return _U32.pack(0xCE, v)
        if v < 1 << 64:
            return _U64.pack(0xCF, v)
    else:
        if v >= -32:
            return bytes((v & 0xFF,))
        if v >= -0x80:
            return _I8.pack(0xD0, v)
        if v >= -0x8000:
            return _I16.pack(0xD1, v)
        if v >= -0x80000000:
            return _I32.pack(0xD2, v)
        if v >= -(1 << 63):
            return _I64.pack(0xD3, v)
    raise ValueError(f"integer {v} does not fit msgpack (-2^63 .. 2^64-1)")


def str_header(n: int) -> bytes:
    """Header of a str of ``n`` UTF-8 bytes."""
    if n < 32:
        return bytes((0xA0 | n,))
    if n < 0x100:
        return _U8.pack(0xD9, n)
    if n < 0x10000:
        return _U16.pack(0xDA, n)
    return _U32.pack(0xDB, n)


def bin_header(n: int) -> bytes:
    """Header of a bin of ``n`` bytes (bin8 even for 0 bytes)."""
    if n < 0x100:
        return _U8.pack(0xC4, n)
    if n < 0x10000:
        return _U16.pack(0xC5, n)
    return _U32.pack(0xC6, n)


def array_header(n: int) -> bytes:
    """Header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return _U16.pack(0xDC, n)
    return _U32.pack(0xDD, n)


def map_header(n: int) -> bytes:
    """Header of a map of ``n`` pairs."""
    if n < 16:
        return bytes((0x80 | n,))
    if n < 0x10000:
        return _U16.pack(0xDE, n)
    return _U32.pack(0xDF, n)


def pack_str(s: str) -> bytes:
    """A msgpack str; lone surrogates are refused by the UTF-8 codec (UnicodeEncodeError)."""
    raw = s.encode("utf-8")
    return str_header(len(raw)) + raw


def pack_meta(meta: Mapping[str, Any]) -> bytes:
    """The canonical encoding of ``meta``: keys sorted by UTF-8 bytes, floats as float64.

    Raises InvalidDocumentError (a ValueError) with a ``$.meta...`` path for
    values the document cannot hold: NaN/Inf, non-str keys, unknown types.
    """
    out = bytearray()
    try:
        if not isinstance(meta, Mapping):
            raise PathError(f"meta must be a dict, got {type(meta).__name__}")
        _pack_value(meta, out, 0, _scalar_types())
    except PathError as e:
        raise InvalidDocumentError(e.message, render("$.meta", e.segments)) from None
    return bytes(out)


class _Scalars(NamedTuple):
    """The bool, int and float types meta may hold."""

    bools: tuple[Any, ...]  # (Any: isinstance then keeps the value's type open for int())
    ints: tuple[Any, ...]
    floats: tuple[Any, ...]


def _scalar_types() -> _Scalars:
    """Python's, and NumPy's scalars once NumPy is loaded: none can exist before, and a
    command that never loads NumPy (``gradstore cid``) must not load it for this."""
    np = sys.modules.get("numpy")
    if np is None:
        return _Scalars((bool,), (int,), (float,))
    return _Scalars((bool, np.bool_), (int, np.integer), (float, np.floating))


def _pack_value(v: Any, out: bytearray, depth: int, scalars: _Scalars) -> None:
    if v is None:
        out.append(0xC0)
    elif isinstance(v, scalars.bools):
        out.append(0xC3 if v else 0xC2)
    elif isinstance(v, scalars.ints):
        try:
            out += pack_int(int(v))
        except ValueError as e:
            raise PathError(str(e)) from None
    elif isinstance(v, scalars.floats):
        f = float(v)
        if not math.isfinite(f):
            raise PathError(f"meta floats must be finite, got {f}")
        out += _F64.pack(0xCB, f)
    elif isinstance(v, str):
        try:
            out += pack_str(v)
        except UnicodeEncodeError:
            raise PathError("str is not valid UTF-8 (lone surrogate)") from None
    elif isinstance(v, bytes | bytearray | memoryview):
        raw = bytes(v)
        if len(raw) > 0xFFFFFFFF:
            raise PathError("bin is longer than msgpack allows (2^32 - 1 bytes)")
        out += bin_header(len(raw)) + raw
    elif isinstance(v, list | tuple):
        _check_depth(depth)
        out += array_header(len(v))
        for i, item in enumerate(v):
            try:
                _pack_value(item, out, depth + 1, scalars)
            except PathError as e:
                e.segments.append(i)
                raise
    elif isinstance(v, Mapping):
        _check_depth(depth)
        items = []
        for key, item in v.items():
            if not isinstance(key, str):
                raise PathError(f"meta map keys must be str, got {type(key).__name__} {key!r}")
            try:
                items.append((key.encode("utf-8"), key, item))
            except UnicodeEncodeError:
                raise PathError(f"key {key!r} is not valid UTF-8") from None
        items.sort(key=lambda t: t[0])
        out += map_header(len(items))
        for raw, key, item in items:
            out += str_header(len(raw)) + raw
            try:
                _pack_value(item, out, depth + 1, scalars)
            except PathError as e:
                e.segments.append(key)
                raise
    else:
        raise PathError(
            f"{type(v).__name__} is not a meta value (nil, bool, int, float, str, bin, list, dict)"
        )


def _check_depth(depth: int) -> None:
    if depth > MAX_META_DEPTH:
        raise PathError(f"meta nests deeper than {MAX_META_DEPTH} levels")
