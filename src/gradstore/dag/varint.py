"""Unsigned LEB128 varints (multiformats / protobuf), strict on input."""

from __future__ import annotations

from ..errors import DAGError

MAX_VARINT_BYTES = 9  # 63 bits: every size and CID field here fits; longer is malformed


def encode_varint(n: int) -> bytes:
    """Minimal unsigned varint encoding of ``n`` (>= 0)."""
    if n < 0:
        raise ValueError(f"varint must be non-negative, got {n}")
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(
    buf: bytes | bytearray | memoryview, pos: int, what: str = "varint"
) -> tuple[int, int]:
    """Decode a varint at ``pos``: (value, offset after it). DAGError if truncated/non-minimal."""
    n = shift = 0
    start = pos
    end = len(buf)
    while True:
        if pos >= end:
            raise DAGError(f"truncated {what} at byte {start}")
        byte = buf[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and pos - start > 1:
                raise DAGError(f"non-minimal {what} at byte {start}")
            return n, pos
        shift += 7
        if pos - start >= MAX_VARINT_BYTES:
            raise DAGError(f"{what} longer than {MAX_VARINT_BYTES} bytes at byte {start}")
