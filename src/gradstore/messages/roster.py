"""A job's peers in canonical order, and sets of them as bitmaps.

Statuses and results name sets of peers (received, refused, aggregated). As lists of
56-character dids they grow by ~60 bytes a peer and overflow a pubsub message at about
18,000 peers; as a bitmap over the job's peers sorted by did they cost one bit a peer.
Both sides read the same job file, and sorting makes the order independent of how the
file lists them.

Bit ``i`` (the ``i``-th did in sorted order) is bit ``7 - i % 8`` of byte ``i // 8``; a bitmap
has exactly ``ceil(n / 8)`` bytes and its padding bits are zero, so a set has one encoding.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..errors import MessageError, Reason


class Roster:
    """The peers of one job, sorted by did, with set <-> bitmap conversions."""

    __slots__ = ("_index", "peers")

    def __init__(self, peers: Iterable[str]) -> None:
        self.peers: tuple[str, ...] = tuple(sorted(set(peers)))
        self._index = {p: i for i, p in enumerate(self.peers)}

    def __len__(self) -> int:
        return len(self.peers)

    def __contains__(self, did: object) -> bool:
        return did in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self.peers)

    def __repr__(self) -> str:
        return f"Roster({len(self.peers)} peers)"

    def index(self, did: str) -> int:
        """The position of ``did`` (KeyError if it is not a peer of the job)."""
        return self._index[did]

    @property
    def nbytes(self) -> int:
        """The length of every bitmap over this roster."""
        return (len(self.peers) + 7) // 8

    def bitmap(self, members: Iterable[str]) -> bytes:
        """The bitmap of ``members`` (each must be a peer of the job)."""
        out = bytearray(self.nbytes)
        for did in members:
            i = self._index.get(did)
            if i is None:
                raise ValueError(f"{did} is not a peer of this job")
            out[i >> 3] |= 0x80 >> (i & 7)
        return bytes(out)

    def check(self, name: str, bitmap: object) -> bytes:
        """``bitmap`` if it is a well-formed bitmap over this roster, else MessageError."""
        if not isinstance(bitmap, bytes):
            raise MessageError(Reason.MALFORMED, f"`{name}` must be a bitmap (msgpack bin)")
        if len(bitmap) != self.nbytes:
            raise MessageError(
                Reason.MALFORMED,
                f"`{name}` has {len(bitmap)} bytes; the job's {len(self)} peers need {self.nbytes}",
            )
        spare = self.nbytes * 8 - len(self.peers)
        if spare and bitmap[-1] & ((1 << spare) - 1):
            raise MessageError(Reason.MALFORMED, f"`{name}` sets bits past the job's last peer")
        return bitmap

    def members(self, bitmap: bytes) -> tuple[str, ...]:
        """The peers whose bits are set, in roster order (``bitmap`` must pass ``check``)."""
        out = []
        for byte_index, byte in enumerate(bitmap):
            if byte:
                base = byte_index << 3
                for bit in range(8):
                    if byte & (0x80 >> bit):
                        out.append(self.peers[base + bit])
        return tuple(out)

    def has(self, bitmap: bytes, did: str) -> bool:
        """Whether ``did``'s bit is set (False for a did that is not a peer)."""
        i = self._index.get(did)
        if i is None or (i >> 3) >= len(bitmap):
            return False
        return bool(bitmap[i >> 3] & (0x80 >> (i & 7)))
