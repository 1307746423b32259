"""The population's random stream: SHA-256 in counter mode, the same bits on every machine.

A decision draws from ``Stream(stream_key(run, seed, interval))``. Block ``j`` of the stream
is ``SHA-256(key || uint64be(j))``; each 32-byte block gives four big-endian uint64 draws, in
order. ``uniform`` is the top 53 bits of a draw times 2**-53 (exact in float64), ``below(n)``
is ``(top53 * n) >> 53`` (integer arithmetic only). No float rounding that differs between
machines enters, so an auditor re-derives the same draws bit for bit (docs/spec.md, section 10.1).
"""

from __future__ import annotations

import hashlib
from typing import Final

STREAM_DOMAIN: Final = b"gradstore/population/1\x00"
_TOP53: Final = 11  # a uint64 draw shifted right by this keeps its top 53 bits


def stream_key(run: str, seed: int, interval: int) -> bytes:
    """The stream key of one interval's decision: ``SHA-256(domain || run || 0x00 ||
    uint64be(seed) || uint64be(interval))``, so no two intervals or runs share draws."""
    if not 0 <= seed < 2**64 or not 0 <= interval < 2**64:
        raise ValueError("seed and interval are unsigned 64-bit integers")
    data = STREAM_DOMAIN + run.encode() + b"\x00" + seed.to_bytes(8, "big")
    return hashlib.sha256(data + interval.to_bytes(8, "big")).digest()


class Stream:
    """Deterministic draws from a key: ``uniform()`` in [0, 1), ``below(n)`` in [0, n)."""

    __slots__ = ("_block", "_counter", "_key", "_used")

    def __init__(self, key: bytes) -> None:
        self._key = bytes(key)
        self._counter = 0
        self._block = b""
        self._used = 4

    def _next64(self) -> int:
        if self._used == 4:
            self._block = hashlib.sha256(self._key + self._counter.to_bytes(8, "big")).digest()
            self._counter += 1
            self._used = 0
        start = self._used * 8
        self._used += 1
        return int.from_bytes(self._block[start : start + 8], "big")

    def uniform(self) -> float:
        """The next draw as a float in [0, 1): its top 53 bits times 2**-53 (exact)."""
        return (self._next64() >> _TOP53) * 2.0**-53

    def below(self, n: int) -> int:
        """The next draw as an int in [0, n): ``(top53 * n) >> 53``, integers only."""
        if n < 1:
            raise ValueError(f"below({n}): n must be >= 1")
        return ((self._next64() >> _TOP53) * n) >> 53
