"""The fast get path on real Kubo (dag-pb nodes by block/get, leaves by `cat` straight into the
buffer, each leaf hashed in place), and ranged reads (``StoredDocument``, read ahead by
``ReadAhead``): a TCP proxy in front of the daemon lies about `cat`'s bytes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from gradstore.dag import CID
from gradstore.errors import DAGError, IntegrityError
from gradstore.format import Gradient, encode
from gradstore.node import KuboDaemon, KuboNode
from gradstore.store import GradientStore, ReadAhead, ReadAheadPool, StoredDocument, read_ahead

from ..tcp_proxy import TcpProxy, serving

pytestmark = pytest.mark.kubo
MIB = 1 << 20


def _read_until(sock: socket.socket, marker: bytes, buf: bytearray) -> bytes:
    while marker not in buf:
        data = sock.recv(65536)
        if not data:
            break
        buf += data
    head, _, rest = bytes(buf).partition(marker)
    buf[:] = rest
    return head + marker


def _dechunk(body: bytes) -> tuple[bytes, bytes]:
    """(data, trailer section) of a chunked body."""
    out = bytearray()
    pos = 0
    while True:
        end = body.index(b"\r\n", pos)
        size = int(body[pos:end].split(b";")[0], 16)
        pos = end + 2
        if size == 0:
            return bytes(out), body[pos:]
        out += body[pos : pos + size]
        pos += size + 2


class CatProxy(TcpProxy):
    """Forwards everything to a real Kubo; answers to ``command`` (``cat`` unless told) get one
    byte flipped or are cut short; ``requests`` counts the requests by command."""

    def __init__(
        self,
        upstream: str,
        *,
        flip_at: int | None = None,
        cut_at: int | None = None,
        command: str = "cat",
    ) -> None:
        super().__init__(upstream)
        self.flip_at, self.cut_at = flip_at, cut_at
        self.command = command
        self.requests: Counter[str] = Counter()

    def handle(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as up:
            pending = bytearray()
            head = _read_until(client, b"\r\n\r\n", pending)
            up.sendall(head + bytes(pending))
            command = head.split(b" ", 2)[1].split(b"?")[0].decode().removeprefix("/api/v0/")
            self.requests[command] += 1
            if command != self.command:
                self._pump(client, up)
                return
            answer = bytearray()
            while data := up.recv(1 << 20):
                answer += data
            resp_head, _, body = bytes(answer).partition(b"\r\n\r\n")
            data, trailers = _dechunk(body)
            if self.flip_at is not None:
                flipped = bytearray(data)
                flipped[self.flip_at] ^= 0x04
                data = bytes(flipped)
            if self.cut_at is not None:
                data, trailers = data[: self.cut_at], b"\r\n"
            chunks = b"".join(
                b"%x\r\n%s\r\n" % (len(data[i : i + 65536]), data[i : i + 65536])
                for i in range(0, len(data), 65536)
            )
            # a reader that gave up (a read-ahead closed after a bad leaf) hangs up meanwhile
            with contextlib.suppress(OSError):
                client.sendall(resp_head + b"\r\n\r\n" + chunks + b"0\r\n" + trailers)

    @property
    def cat_requests(self) -> int:
        return self.requests["cat"]

    @staticmethod
    def _pump(client: socket.socket, up: socket.socket) -> None:
        def copy(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)

        back = threading.Thread(target=copy, args=(up, client), daemon=True)
        back.start()
        copy(client, up)
        back.join(10)


@contextmanager
def proxy(daemon: KuboDaemon, **kwargs: Any) -> Iterator[CatProxy]:
    with serving(CatProxy(daemon.api_url, **kwargs)) as p:
        yield p


def _gradient() -> Gradient:
    rng = np.random.default_rng(31337)
    return Gradient({"w": rng.standard_normal(800_000).astype(np.float32)})  # ~3.2 MB, four leaves


def _put(daemon: KuboDaemon, g: Gradient) -> CID:
    async def go() -> CID:
        async with daemon.node() as node:
            return await GradientStore(node).put(g)

    return asyncio.run(go())


def test_an_honest_proxy_changes_nothing(kubo: KuboDaemon) -> None:
    g = _gradient()
    cid = _put(kubo, g)

    async def go() -> None:
        with proxy(kubo) as p:
            async with KuboNode(p.url) as node:
                assert node.bulk_reads
                assert await GradientStore(node).get(cid) == g
            assert p.cat_requests == 1  # the leaves came by `cat`, not by a CAR

    asyncio.run(go())


def test_one_flipped_byte_in_cat_is_an_integrity_error_naming_the_leaf(kubo: KuboDaemon) -> None:
    g = _gradient()
    cid = _put(kubo, g)

    async def go() -> None:
        with proxy(kubo, flip_at=MIB + 777) as p:  # inside the second leaf
            async with KuboNode(p.url) as node:
                got: list[Gradient] = []
                with pytest.raises(IntegrityError) as info:
                    got.append(await GradientStore(node).get(cid))
                assert not got and p.cat_requests == 1
        leaf = CID.parse(info.value.cid)
        assert leaf != cid and leaf.codec == 0x55 and str(leaf) in str(info.value)

    asyncio.run(go())


def test_a_short_cat_body_is_refused(kubo: KuboDaemon) -> None:
    g = _gradient()
    cid = _put(kubo, g)

    async def go() -> None:
        with proxy(kubo, cut_at=2 * MIB + 5) as p:
            async with KuboNode(p.url) as node:
                with pytest.raises(DAGError, match="incomplete"):
                    await GradientStore(node).get(cid)
                assert p.cat_requests == 1

    asyncio.run(go())


def test_ranged_reads_verify_every_leaf_they_touch(kubo: KuboDaemon) -> None:
    # StoredDocument: the coordinator reads inputs back range by range (ranged `cat`);
    # honest ranges give the document's bytes, a flipped byte is an IntegrityError
    g = _gradient()
    cid = _put(kubo, g)
    doc = encode_bytes(g)

    async def go() -> None:
        with proxy(kubo) as p:
            async with KuboNode(p.url) as node:
                stored = await StoredDocument.open(node, cid, 8 * MIB)
                assert [s.size for s in stored.leaves] == [MIB, MIB, MIB, len(doc) - 3 * MIB]
                out = np.empty(MIB + 1000, np.uint8)
                for offset in (10, MIB + 10, 2 * MIB - 500):  # across leaves, in order
                    await stored.read_into(offset, out)
                    assert out.tobytes() == doc[offset : offset + out.size]
                assert p.cat_requests >= 2
        with proxy(kubo, flip_at=MIB - 3) as p:  # in the first leaf of the range
            async with KuboNode(p.url) as node:
                stored = await StoredDocument.open(node, cid, 8 * MIB)
                with pytest.raises(IntegrityError) as info:
                    await stored.read_into(MIB + 10, np.empty(2 * MIB, np.uint8))
                assert CID.parse(info.value.cid) == stored.leaves[1].cid

    asyncio.run(go())


def encode_bytes(g: Gradient) -> bytes:
    return b"".join(bytes(piece) for piece in encode(g))


def _large_gradient() -> Gradient:
    rng = np.random.default_rng(4242)
    return Gradient({"w": rng.standard_normal(1_800_000).astype(np.float32)})  # 7.2 MB: 7 leaves


def test_read_ahead_gives_the_documents_bytes_in_any_order_by_ranges_of_several_leaves(
    kubo: KuboDaemon,
) -> None:
    # the aggregation pass reads an input front to back through ReadAhead: ranges of whole
    # leaves kept in flight ahead of it; going back or jumping ahead starts over where it lands
    g = _large_gradient()
    cid = _put(kubo, g)
    doc = encode_bytes(g)

    async def go() -> None:
        with proxy(kubo) as p:
            async with KuboNode(p.url) as node:
                stored = await StoredDocument.open(node, cid, 16 * MIB)
                pool = ReadAheadPool(8 * MIB, depth=2)  # one document: ranges of 4 leaves
                reader = read_ahead(stored, pool)
                assert isinstance(reader, ReadAhead) and pool.range_bytes() == 4 * MIB
                out = np.empty(700_000, np.uint8)
                offsets = [*range(0, len(doc) - out.size, out.size), 10, 5 * MIB + 3, 2 * MIB]
                for offset in offsets:  # front to back, then back, ahead, back
                    await reader.read_into(offset, out)
                    assert out.tobytes() == doc[offset : offset + out.size], offset
                tail = np.empty(100, np.uint8)
                await reader.read_into(len(doc) - 100, tail)
                assert tail.tobytes() == doc[-100:]
                reader.close()
                assert p.cat_requests == pool.requests <= 6  # not one request per read
        assert len(stored.leaves) == 7

    asyncio.run(go())


def test_read_ahead_keeps_the_next_range_in_flight_while_the_reader_works(
    kubo: KuboDaemon,
) -> None:
    g = _large_gradient()
    cid = _put(kubo, g)

    async def go() -> None:
        async with kubo.node() as node:
            stored = await StoredDocument.open(node, cid, 16 * MIB)
            pool = ReadAheadPool(4 * MIB, depth=2)  # ranges of 2 leaves, 2 in flight
            reader = read_ahead(stored, pool)
            await reader.read_into(0, np.empty(1000, np.uint8))
            assert pool.requests == 2  # the second range was asked for with the first
            await reader.read_into(MIB, np.empty(MIB + 10, np.uint8))  # into the second
            assert pool.requests == 3
            assert isinstance(reader, ReadAhead)
            reader.close()

    asyncio.run(go())


def test_read_ahead_hashes_every_leaf_before_handing_out_a_byte(kubo: KuboDaemon) -> None:
    g = _large_gradient()
    cid = _put(kubo, g)

    async def go() -> None:
        with proxy(kubo, flip_at=MIB + 777) as p:  # the second leaf of every range
            async with KuboNode(p.url) as node:
                stored = await StoredDocument.open(node, cid, 16 * MIB)
                reader = read_ahead(stored, ReadAheadPool(8 * MIB, depth=2))
                out = np.zeros(1000, np.uint8)  # in the first leaf: intact, but its range is not
                with pytest.raises(IntegrityError) as info:
                    await reader.read_into(0, out)
                assert CID.parse(info.value.cid) == stored.leaves[1].cid
                assert not out.any()  # nothing was handed out
                assert isinstance(reader, ReadAhead)
                reader.close()

    asyncio.run(go())


def test_block_get_reads_on_its_own_socket_and_a_flipped_byte_is_an_integrity_error(
    kubo: KuboDaemon,
) -> None:
    # the root of every input comes by block/get: on a plain http API it is read as `cat`
    # is (bulk.BulkRead, a fifth of httpx's CPU), and verified all the same
    g = _gradient()
    cid = _put(kubo, g)

    async def go() -> None:
        with proxy(kubo, command="block/get") as p:
            async with KuboNode(p.url) as node:
                await node.client.aclose()  # httpx is not what reads it
                assert await GradientStore(node).get(cid) == g
            assert p.requests == {"block/get": 1, "cat": 1}
        root = await _root(kubo, cid)
        with proxy(kubo, command="block/get", flip_at=len(root) // 2) as p:
            async with KuboNode(p.url) as node:
                with pytest.raises(IntegrityError) as info:
                    await node.get_block(cid)
                assert CID.parse(info.value.cid) == cid
                with pytest.raises(IntegrityError):
                    await GradientStore(node).get(cid)

    asyncio.run(go())


async def _root(kubo: KuboDaemon, cid: CID) -> bytes:
    async with kubo.node() as node:
        return await node.get_block(cid)


def test_a_small_document_is_hashed_by_its_reading_thread_and_a_large_one_beside_it(
    kubo: KuboDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    # starting a hashing thread, and waking it per leaf, cost a small document (a stepped
    # round's 1 MiB inputs) more than the overlap saves: up to 4 MiB the thread that reads
    # hashes each leaf as it is in; beyond, a thread of its own hashes beside the read
    started: list[str] = []
    start = threading.Thread.start

    def watched(self: threading.Thread) -> None:
        started.append(self.name)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", watched)
    small, large = _gradient(), _large_gradient()  # 3.2 MB and 7.2 MB
    small_cid, large_cid = _put(kubo, small), _put(kubo, large)

    async def go() -> None:
        async with kubo.node() as node:
            started.clear()
            assert await GradientStore(node).get(small_cid) == small
            assert "gradstore-leaf-hasher" not in started
            assert await GradientStore(node).get(large_cid) == large
            assert "gradstore-leaf-hasher" in started
        for flip_at, cid in ((MIB + 777, small_cid), (5 * MIB + 3, large_cid)):
            with proxy(kubo, flip_at=flip_at) as p:
                async with KuboNode(p.url) as node:
                    with pytest.raises(IntegrityError) as info:
                        await GradientStore(node).get(cid)
                    assert CID.parse(info.value.cid).codec == 0x55 and p.cat_requests == 1

    asyncio.run(go())
