"""The bulk reader's chunked bodies (``bulk._Staged``, ``BulkRead._dechunk``): any framing a
server may send, in any pieces, gives the body's bytes; a bad frame is an error, never bytes.

A loopback server answers ``cat_into`` with a chunked body it frames and splits itself.
"""

from __future__ import annotations

import asyncio
import io
import socket
import time
from typing import Any

import numpy as np
import pytest
from tests.node.test_kubo_errors import CID_X, FAST, serving

from gradstore.errors import IntegrityError, KuboCommandError, NodeError
from gradstore.node import KuboNode
from gradstore.node.kubo import bulk

HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Stream-Error\r\n\r\n"


def _framed(data: bytes, sizes: list[int], *, ext: bytes = b"", trailers: bytes = b"") -> bytes:
    """``data`` in chunks of ``sizes`` (cycled), the last chunk and ``trailers``."""
    out, pos, i = bytearray(), 0, 0
    while pos < len(data):
        n = min(sizes[i % len(sizes)], len(data) - pos)
        out += b"%x%s\r\n" % (n, ext) + data[pos : pos + n] + b"\r\n"
        pos, i = pos + n, i + 1
    return bytes(out) + b"0\r\n" + trailers + b"\r\n"


def _answer(body: bytes, pieces: int) -> object:
    def behave(conn: socket.socket) -> None:
        whole = HEAD + body
        step = max(1, len(whole) // pieces)
        for i in range(0, len(whole), step):
            conn.sendall(whole[i : i + step])
            if pieces > 1:
                time.sleep(0.001)
        conn.close()

    return behave


def _cat(api: str, size: int) -> tuple[int, bytes, list[int]]:
    async def go() -> tuple[int, bytes, list[int]]:
        async with KuboNode(api, timeouts=FAST) as node:
            out = bytearray(size)
            told: list[int] = []
            n = await node.cat_into(CID_X, out, progress=told.append)
            return n, bytes(out[:n]), told

    return asyncio.run(go())


DATA = np.random.default_rng(3).bytes(300_000)


@pytest.mark.parametrize(
    ("sizes", "pieces", "ext"),
    [
        ([4096], 1, b""),  # Kubo's 4 KiB chunks, all at once
        ([4096], 97, b""),  # ... in pieces that cut lines and data anywhere
        ([1, 2, 3, 70_000], 13, b""),  # tiny chunks and one larger than the stage's free room
        ([300_000], 5, b""),  # one chunk of the whole body
        ([4096], 7, b";name=value"),  # chunk extensions
    ],
)
def test_any_framing_in_any_pieces_gives_the_bodys_bytes(
    sizes: list[int], pieces: int, ext: bytes
) -> None:
    with serving(_answer(_framed(DATA, sizes, ext=ext), pieces)) as api:
        n, got, told = _cat(api, len(DATA) + 10)
    assert n == len(DATA) and got == DATA
    assert told[-1] == len(DATA) and told == sorted(told)


def test_a_body_longer_than_the_buffer_is_refused() -> None:
    framed = _framed(DATA, [4096])
    with serving(_answer(framed, 3)) as api, pytest.raises(IntegrityError, match="sent more than"):
        _cat(api, len(DATA) - 1)


def test_an_error_in_the_trailer_is_the_nodes_error() -> None:
    body = _framed(DATA[:10_000], [4096], trailers=b"X-Stream-Error: merkledag: not found\r\n")
    with serving(_answer(body, 3)) as api, pytest.raises(NodeError, match="not found"):
        _cat(api, len(DATA))


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nabc\r\n0\r\n\r\n",  # not a hex size
        b"-3\r\nabc\r\n0\r\n\r\n",  # a negative size
        b"3\r\nabcX\r\n0\r\n\r\n",  # data longer than its size
        b"1000\r\n" + b"a" * 4096 + b"XX0\r\n\r\n",  # no line end after the data
    ],
)
def test_a_bad_frame_is_an_error(body: bytes) -> None:
    with serving(_answer(body, 1)) as api, pytest.raises(NodeError) as info:
        _cat(api, 10_000)
    assert not isinstance(info.value, KuboCommandError)
    assert "chunk" in str(info.value)


def test_a_body_cut_mid_chunk_is_a_broken_connection() -> None:
    body = _framed(DATA, [4096])[:50_000]
    with serving(_answer(body, 4)) as api, pytest.raises(NodeError, match="failed"):
        _cat(api, len(DATA))


class _Trickle(io.RawIOBase):
    """A stream that has ``piece`` bytes more each time it is read (a producer that writes
    4 KiB at a time), or everything written since the last read once ``sleep`` was called."""

    def __init__(self, data: bytes, piece: int) -> None:
        self.data, self.piece, self.pos = data, piece, 0
        self.ready = piece
        self.sleeps = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.ready, len(self.data) - self.pos)
        b[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        self.ready = self.piece
        return n

    def slept(self, _: float) -> None:
        self.sleeps += 1
        self.ready = 25 * self.piece  # what the producer wrote meanwhile


def test_a_short_read_is_followed_by_a_pause_and_pieces_pile_up_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Kubo flushes `cat` 4 KiB at a time: a reader that took each piece as it landed made
    # 330 reads (and 2.5 ms of CPU) a MiB; after a pause of bulk.PACE_S it takes ~100 KiB
    body = _framed(DATA, [4096])
    raw = _Trickle(body, 4096)
    monkeypatch.setattr(bulk.time, "sleep", raw.slept)
    staged = bulk._Staged(io.BufferedReader(raw, 256 * 1024))
    reads = 0
    while staged.end < len(body) and staged.more():
        reads += 1
        staged.at = staged.end  # consumed
    assert raw.pos == len(body)
    assert reads < 10 and raw.sleeps >= 1, reads  # 74 reads of 4 KiB without pauses
