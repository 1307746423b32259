"""GradientStore against real Kubo daemons: CID parity with `ipfs add`, bitswap, lying nodes."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from gradstore.compress import compress
from gradstore.dag import CID, RAW, Block, file_cid
from gradstore.errors import BlockNotFoundError, IntegrityError, InvalidDocumentError, NodeError
from gradstore.format import CompressedGradient, Gradient, encode
from gradstore.node import KuboDaemon, KuboNode
from gradstore.node.kubo import counts
from gradstore.node.kubo.guarded_import import CanaryGuardedImport
from gradstore.store import GradientStore, _put

pytestmark = pytest.mark.kubo
SEED = 7
MIB = 1 << 20


def _only_hash(daemon: KuboDaemon, path: Path) -> str:
    out = daemon.run("add", "--only-hash", "-Q", str(path))
    return out.stdout.decode().strip()


@pytest.mark.parametrize("size", [0, 1, MIB - 1, MIB, MIB + 1])
def test_raw_cid_parity_with_ipfs_add(kubo: KuboDaemon, tmp_path: Path, size: int) -> None:
    data = np.random.default_rng(SEED + size).integers(0, 256, size, dtype=np.uint8)
    path = tmp_path / "payload"
    data.tofile(path)
    assert str(file_cid([memoryview(data)])) == _only_hash(kubo, path), (
        f"size {size}, seed {SEED + size}"
    )


@pytest.mark.slow
def test_raw_cid_parity_two_level_tree(kubo: KuboDaemon, tmp_path: Path) -> None:
    size = 1024 * MIB + 3 * MIB + 17  # > 1024 leaves: the root holds a full node and a partial one
    path = tmp_path / "big"
    block = np.random.default_rng(SEED).integers(0, 256, 8 * MIB, dtype=np.uint8)
    with open(path, "wb") as f:
        for i in range(0, size, block.size):
            block[: min(block.size, size - i)].tofile(f)
    with open(path, "rb") as f:
        ours = file_cid(iter(lambda: f.read(16 * MIB), b""))
    assert str(ours) == _only_hash(kubo, path)


#: Float32 elements of a document over ``_put.ONE_REQUEST_BYTES`` (17.2 MB): put streams it
#: through a guarded import (the smaller ones go in one request).
GUARDED_N = 4_300_000


def _gradient(n: int, seed: int = SEED) -> Gradient:
    rng = np.random.default_rng(seed)
    return Gradient(
        {"w": rng.standard_normal(n).astype(np.float32), "b": np.zeros(3)}, {"peer": "p"}
    )


def test_put_matches_ipfs_add_of_the_document(kubo: KuboDaemon, tmp_path: Path) -> None:
    g = _gradient(700_000)  # ~2.8 MB, three leaves
    doc = tmp_path / "doc"
    with open(doc, "wb") as f:
        encode(g).write_to(f)

    async def go() -> CID:
        async with kubo.node() as node:
            cid = await GradientStore(node).put(g)
            assert cid in await node.pins()
            return cid

    assert str(asyncio.run(go())) == _only_hash(kubo, doc)


def test_put_on_a_get_on_b_over_bitswap(kubo_factory) -> None:  # type: ignore[no-untyped-def]
    a, b = kubo_factory(2, connect=True)
    g = _gradient(900_000, seed=11)

    async def go() -> None:
        async with a.node() as na, b.node() as nb:
            cid = await GradientStore(na).put(g)
            assert not await nb.has_block(cid)
            got = await GradientStore(nb).get(cid)
            assert got == g
            assert await nb.has_block(cid)

    asyncio.run(go())


class _FlipOneByte(httpx.AsyncBaseTransport):
    """In front of a real Kubo: forwards every call, flips one byte of dag/export's body."""

    def __init__(self, at: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.at = at
        self.flipped = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/dag/export"):
            return response
        outer = self
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)

        async def body() -> AsyncIterator[bytes]:
            seen = 0
            async for chunk in stream:
                if seen <= outer.at < seen + len(chunk):
                    mutable = bytearray(chunk)
                    mutable[outer.at - seen] ^= 0x20
                    chunk = bytes(mutable)
                    outer.flipped = True
                seen += len(chunk)
                yield chunk

        class _Stream(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for c in body():
                    yield c

            async def aclose(self) -> None:
                await stream.aclose()

        return httpx.Response(response.status_code, headers=response.headers, stream=_Stream())

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_node_that_flips_one_byte_gives_an_integrity_error(kubo: KuboDaemon) -> None:
    g = _gradient(800_000, seed=5)

    async def go() -> None:
        async with kubo.node() as honest:
            cid = await GradientStore(honest).put(g)
        liar = _FlipOneByte(at=MIB + 4096)  # inside the first leaf after the root
        async with KuboNode(kubo.api_url, transport=liar) as node:
            decoded: list[Gradient] = []
            with pytest.raises(IntegrityError) as info:
                decoded.append(await GradientStore(node).get(cid))
            assert liar.flipped and not decoded
            assert info.value.cid in str(info.value)
            assert CID.parse(info.value.cid) != cid  # a leaf named, found by its own hash

    asyncio.run(go())


@pytest.mark.slow
def test_profile_flags_give_the_same_cid_past_the_default_link_limit(
    kubo: KuboDaemon, tmp_path: Path
) -> None:
    """The README's flags for a repo without the profile; 200 chunks exceed Kubo's default 174 links."""
    size = 200 * MIB + 5
    data = np.random.default_rng(SEED).integers(0, 256, size, dtype=np.uint8)
    path = tmp_path / "payload"
    data.tofile(path)
    flags = ["--cid-version=1", "--raw-leaves", "--chunker=size-1048576", "--max-file-links=1024"]
    out = kubo.run("add", "--only-hash", "-Q", *flags, str(path)).stdout.decode().strip()
    assert out == str(file_cid([memoryview(data)]))


class _Recording:
    """Wraps ``KuboNode.guarded_import`` to keep each ``CanaryGuardedImport`` it hands out."""

    def __init__(self, node: KuboNode) -> None:
        self.imports: list[CanaryGuardedImport] = []
        make = node.guarded_import

        def guarded_import() -> CanaryGuardedImport:
            self.imports.append(make())
            return self.imports[-1]

        node.guarded_import = guarded_import  # type: ignore[method-assign]


def test_put_pins_only_the_root_and_leaves_its_canaries_to_the_gc(kubo: KuboDaemon) -> None:
    # The canaries are not removed by put: block/rm makes Kubo walk every pinned DAG to
    # check them, a cost that grows with all the node keeps (docs/design/storage.md). They stay
    # unpinned, and a GC removes them without touching the pinned gradient.
    g = _gradient(GUARDED_N, seed=SEED + 2)  # over ONE_REQUEST_BYTES: guarded

    async def go() -> None:
        async with kubo.node() as node:
            recording = _Recording(node)
            before = await node.pins()
            cid = await GradientStore(node).put(g)
            assert cid == file_cid(encode(g))
            assert await node.pins() - before == {cid}
            (guarded,) = recording.imports
            assert len(guarded.canaries) == 2  # one per leaf stream
            assert not await node.has_block(guarded.guard)  # never stored
            for canary in guarded.canaries:  # left, unpinned, for the GC
                assert await node.has_block(canary)
            await asyncio.to_thread(kubo.run, "repo", "gc", "--quiet")
            for canary in guarded.canaries:
                assert not await node.has_block(canary)
            # the whole DAG is there: Kubo walks it offline without complaint
            stat = await node.dag_stat(cid, offline=True)
            assert stat["TotalSize"] >= encode(g).size
            assert decode_equal(await GradientStore(node).get(cid), g)

    asyncio.run(go())


@pytest.mark.parametrize("n", [100, 400_000])  # one raw leaf as the root; two leaves
def test_a_small_put_is_one_request_that_pins_its_whole_dag(kubo: KuboDaemon, n: int) -> None:
    # A document of at most SMALL_PUT_BYTES (a step's aggregate) goes as one complete CAR
    # whose root the import pins, in one request instead of the guarded streams' five (two
    # imports, a dag/put, two canary checks): a GC right after leaves it whole.
    g = _gradient(n, seed=SEED + 6)  # blocks no other test pins
    assert encode(g).size <= _put.SMALL_PUT_BYTES

    async def go() -> None:
        async with kubo.node() as node:
            recording = _Recording(node)
            before_pins = await node.pins()
            before = Counter(counts.REQUESTS)
            cid = await GradientStore(node).put(g)
            sent = Counter(counts.REQUESTS)
            sent.subtract(before)
            assert +sent == Counter({"dag/import": 1})
            assert recording.imports == []  # no guarded import
            assert cid == file_cid(encode(g))
            assert await node.pins() - before_pins == {cid}
            await asyncio.to_thread(kubo.run, "repo", "gc", "--quiet")
            stat = await node.dag_stat(cid, offline=True)  # raises if a block is missing
            assert stat["TotalSize"] >= encode(g).size
            assert decode_equal(await GradientStore(node).get(cid), g)

    asyncio.run(go())


def test_a_small_put_takes_a_block_naming_its_root_in_the_same_request(
    kubo: KuboDaemon,
) -> None:
    # A step's record names its aggregate: both go in the aggregate's one CAR import (no
    # block/put), the aggregate pinned, the record only stored (the coordinator pins it
    # directly); a document too large for one request is not stored at all (None).
    g = _gradient(1000, seed=SEED + 7)
    big = _gradient(GUARDED_N, seed=SEED + 8)  # over ONE_REQUEST_BYTES
    assert encode(big).size > _put.ONE_REQUEST_BYTES

    def naming(root: CID) -> Block:
        data = b"a record of " + str(root).encode()
        return Block(CID.hash(RAW, data), data)

    async def go() -> None:
        async with kubo.node() as node:
            store = GradientStore(node)
            before_pins = await node.pins()
            before = Counter(counts.REQUESTS)
            stored = await store.put_with(g, naming)
            sent = Counter(counts.REQUESTS)
            sent.subtract(before)
            assert +sent == Counter({"dag/import": 1})
            assert stored is not None
            cid, block = stored
            assert cid == file_cid(encode(g)) and block == naming(cid)
            assert await node.get_block(block.cid) == block.data
            assert await node.pins() - before_pins == {cid}
            assert decode_equal(await store.get(cid), g)
            assert await store.put_with(big, naming) is None
            assert not await node.has_block(file_cid(encode(big)))

    asyncio.run(go())


def test_a_step_sized_put_is_one_request_unless_progress_is_asked_for(kubo: KuboDaemon) -> None:
    # A step of 12.8 MB (a 1792 x 1792 float32 layer) put by a peer or a coordinator, who ask
    # for no progress, goes in one request; with progress (gradstore put, whose --timeout
    # counts from it) it streams through a guarded import as before. The same CID, pinned.
    g = _gradient(3_200_000, seed=SEED + 9)  # 12.8 MB
    assert _put.SMALL_PUT_BYTES < encode(g).size <= _put.ONE_REQUEST_BYTES

    async def go() -> None:
        async with kubo.node() as node:
            before = Counter(counts.REQUESTS)
            cid = await GradientStore(node).put(g)
            sent = Counter(counts.REQUESTS)
            sent.subtract(before)
            assert +sent == Counter({"dag/import": 1})
            assert cid == file_cid(encode(g)) and cid in await node.pins()
            await node.unpin(cid)
            await asyncio.to_thread(kubo.run, "repo", "gc", "--quiet")
            told: list[int] = []
            before = Counter(counts.REQUESTS)
            assert await GradientStore(node).put(g, progress=lambda n, _: told.append(n)) == cid
            sent = Counter(counts.REQUESTS)
            sent.subtract(before)
            assert sent["dag/import"] == 2 and sent["dag/put"] == 1
            assert len(told) > 2 and cid in await node.pins()

    asyncio.run(go())


def decode_equal(a: Gradient, b: Gradient) -> bool:
    return (
        a.meta == b.meta
        and all(np.array_equal(a.tensors[k], b.tensors[k]) for k in b.tensors)
        and sorted(a.tensors) == sorted(b.tensors)
    )


def _gc_before_the_root(kubo: KuboDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``ipfs repo gc`` between put's leaf imports and its root's pin."""
    original_finish = CanaryGuardedImport.finish

    async def finish_after_gc(self: CanaryGuardedImport, root, *, pin):  # type: ignore[no-untyped-def]
        await asyncio.to_thread(kubo.run, "repo", "gc", "--quiet")
        return await original_finish(self, root, pin=pin)

    monkeypatch.setattr(CanaryGuardedImport, "finish", finish_after_gc)


def test_a_gc_during_put_is_caught_and_the_dag_sent_again(
    kubo: KuboDaemon, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A GC between the leaf imports and the root's pin collects the unpinned leaves. put must
    # notice (its canaries are gone) and send the DAG again, so the pinned root is complete.
    g = _gradient(GUARDED_N, seed=SEED + 1)  # blocks no other test pins
    _gc_before_the_root(kubo, monkeypatch)

    async def go() -> None:
        async with kubo.node() as node:
            recording = _Recording(node)
            before = await node.pins()
            cid = await GradientStore(node).put(g)
            assert len(recording.imports) == 1  # the DAG went again as one walked CAR
            assert await node.pins() - before == {cid}
            stat = await node.dag_stat(cid, offline=True)  # raises if a block is missing
            assert stat["TotalSize"] >= encode(g).size
            assert decode_equal(await GradientStore(node).get(cid), g)
            assert "collected garbage during the upload" in caplog.text

    asyncio.run(go())


def test_a_failed_re_send_after_a_gc_leaves_no_pin_over_missing_blocks(
    kubo: KuboDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The GC of the test above, then the re-send fails too: put raises, and the root it had
    # pinned over collected leaves is unpinned rather than left as a pin that protects nothing.
    g = _gradient(GUARDED_N, seed=SEED + 5)  # blocks no other test pins

    async def failing_re_send(*args: object) -> None:
        raise NodeError("connection lost during the re-send")

    _gc_before_the_root(kubo, monkeypatch)
    monkeypatch.setattr(_put, "_import_checked", failing_re_send)

    async def go() -> None:
        async with kubo.node() as node:
            before = await node.pins()
            with pytest.raises(NodeError, match="connection lost"):
                await GradientStore(node).put(g)
            assert await node.pins() == before
            with pytest.raises(BlockNotFoundError):
                await node.dag_stat(file_cid(encode(g)), offline=True)

    asyncio.run(go())


@pytest.mark.slow
def test_put_of_a_two_level_tree_pins_a_complete_dag(kubo: KuboDaemon) -> None:
    # > 1024 leaves: the dag-pb nodes below the root go in a request of their own
    g = Gradient({"w": np.arange(1025 * MIB // 4 + 5, dtype=np.float32)}, {})

    async def go() -> None:
        async with kubo.node() as node:
            before = await node.pins()
            cid = await GradientStore(node).put(g)
            try:
                assert cid == file_cid(encode(g))
                assert await node.pins() - before == {cid}
                stat = await node.dag_stat(cid, offline=True)
                leaves = -(-encode(g).size // MIB)  # 1026: the header pushes the tail into one more
                assert stat["UniqueBlocks"] == leaves + 1 + 2  # the root, two nodes below it
            finally:
                await node.unpin(cid)
                await asyncio.to_thread(kubo.run, "repo", "gc", "--quiet")

    asyncio.run(go())


class _WrongDagPut(httpx.AsyncBaseTransport):
    """In front of a real Kubo: forwards every call, but answers dag/put with another CID."""

    def __init__(self, claimed: CID) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.claimed = claimed

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/dag/put"):
            return response
        await response.aread()
        body = b'{"Cid":{"/":"%s"}}\n' % str(self.claimed).encode()
        return httpx.Response(200, headers={"Content-Type": "application/json"}, content=body)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_node_that_stores_another_root_fails_the_put(kubo: KuboDaemon) -> None:
    g = _gradient(GUARDED_N, seed=SEED + 3)  # over ONE_REQUEST_BYTES: its root goes by dag/put
    other = file_cid(encode(_gradient(GUARDED_N, seed=SEED + 4)))

    async def go() -> None:
        async with KuboNode(kubo.api_url, transport=_WrongDagPut(other)) as node:
            with pytest.raises(IntegrityError, match="dag/put stored"):
                await GradientStore(node).put(g)

    asyncio.run(go())


def test_get_any_returns_a_compressed_gradient_and_get_points_to_it(kubo: KuboDaemon) -> None:
    dense = _gradient(20_000)
    compressed = compress(dense, "topk:0.1")

    async def go() -> None:
        async with kubo.node() as node:
            store = GradientStore(node)
            cid = await store.put(compressed)
            got = await store.get_any(cid)
            assert isinstance(got, CompressedGradient) and got == compressed
            with pytest.raises(InvalidDocumentError, match=r"get_any\(\)"):
                await store.get(cid)
            plain = await store.get_any(await store.put(dense))
            assert isinstance(plain, Gradient) and plain == dense

    asyncio.run(go())
