"""Fixed-size chunking of a stream of buffers, zero-copy wherever a chunk lies in one piece.

Kubo's ``size-N`` splitter cuts the concatenated input every N bytes; the last
chunk holds the remainder and no chunk is ever empty. Pieces are typically the
gradstore/1 document's parts (msgpack headers and tensor buffers), so most
chunks are slices of a tensor and cost nothing to produce.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from .profile import CHUNK_SIZE

if TYPE_CHECKING:
    from typing_extensions import Buffer


def as_bytes_view(piece: Buffer) -> memoryview:
    """A flat unsigned-byte view of ``piece`` (bytes, bytearray, memoryview, C-contiguous array)."""
    view = memoryview(piece)
    if view.format == "B" and view.ndim == 1:
        return view
    if not view.c_contiguous:
        raise TypeError("a C-contiguous buffer is needed (use np.ascontiguousarray)")
    return view.cast("B")


def chunks(pieces: Iterable[Buffer], size: int = CHUNK_SIZE) -> Iterator[memoryview]:
    """Yield fixed ``size`` chunks of the concatenation of ``pieces``; the last is the remainder.

    A chunk inside one piece is a zero-copy slice of it; a chunk that straddles
    pieces is copied into a fresh buffer (never reused, so a consumer may keep
    every chunk it was given). Empty input yields nothing.
    """
    if size <= 0:
        raise ValueError(f"chunk size must be positive, got {size}")
    pending: bytearray | None = None  # a partly filled chunk straddling pieces
    fill = 0
    for piece in pieces:
        view = as_bytes_view(piece)
        n = len(view)
        pos = 0
        if pending is not None:
            take = min(size - fill, n)
            pending[fill : fill + take] = view[:take]
            fill += take
            pos = take
            if fill < size:
                continue
            yield memoryview(pending)
            pending = None
            fill = 0
        while n - pos >= size:
            yield view[pos : pos + size]
            pos += size
        if pos < n:
            pending = bytearray(size)
            fill = n - pos
            pending[:fill] = view[pos:]
    if pending is not None:
        yield memoryview(pending)[:fill]
