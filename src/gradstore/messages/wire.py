"""Strict canonical msgpack for small flat maps: one encoding per value, anything else refused.

Canonical means what ``msgpack.packb(use_bin_type=True)`` writes for a dict in
insertion order: smallest int / str / array / map headers, float64, str for
text, bin for bytes. Decoding re-encodes and compares, so non-minimal ints,
float32, str8 where fixstr fits, duplicate keys or trailing bytes never pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from ..errors import MessageError, Reason


def pack_map(pairs: Sequence[tuple[str, Any]]) -> bytes:
    """The canonical msgpack encoding of a map with keys in the given order."""
    out: bytes = msgpack.packb(dict(pairs), use_bin_type=True)
    return out


def unpack_map(data: bytes | bytearray | memoryview) -> list[tuple[str, Any]]:
    """Decode one canonical flat msgpack map into its (key, value) pairs, in wire order.

    Values may be nil, bool, int, float, str, bin or arrays of those; nested maps
    and extension types are refused. Raises ``MessageError(Reason.MALFORMED, ...)``.
    """
    try:
        pairs = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            object_pairs_hook=list,
            timestamp=0,
        )
    except (
        Exception
    ) as exc:  # msgpack raises ValueError, ExtraData, FormatError, UnicodeDecodeError, ...
        raise MessageError(
            Reason.MALFORMED, f"not a msgpack value ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(pairs, list) or not all(isinstance(p, tuple) for p in pairs):
        raise MessageError(Reason.MALFORMED, "a message must be a msgpack map")
    for key, value in pairs:
        if not isinstance(key, str):
            raise MessageError(
                Reason.MALFORMED, f"map keys must be strings, got {type(key).__name__}"
            )
        _check_flat(key, value)
    if pack_map(pairs) != bytes(data):
        raise MessageError(
            Reason.MALFORMED,
            "not canonical msgpack (non-minimal int or length, float32, duplicate keys, ...)",
        )
    return pairs


def _check_flat(key: str, value: Any) -> None:
    if isinstance(value, list):
        for item in value:
            if isinstance(item, list | tuple):
                raise MessageError(
                    Reason.MALFORMED, f"`{key}`: nested arrays and maps are not allowed"
                )
            _check_flat(key, item)
    elif value is not None and not isinstance(value, bool | int | float | str | bytes):
        raise MessageError(
            Reason.MALFORMED, f"`{key}`: {type(value).__name__} values are not allowed"
        )
