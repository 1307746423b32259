"""KuboNode against real, isolated Kubo daemons (marker ``kubo`` via the fixtures)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from gradstore.dag import Block, CarReader, build_file, file_cid, write_car
from gradstore.dag.cid import CID, DAG_PB, RAW
from gradstore.errors import (
    BlockNotFoundError,
    KuboCommandError,
    LimitExceededError,
)
from gradstore.node import MAX_PUBSUB_DATA, KuboDaemon, KuboNode, LocalNode
from gradstore.node.kubo import counts

Factory = Callable[..., list[KuboDaemon]]
SEED = 20240611


def random_bytes(n: int, seed: int = SEED) -> bytes:
    return np.random.default_rng(seed).bytes(n)


def small_dag(seed: int = SEED, size: int = 5000, chunk: int = 1024) -> list[Block]:
    """A multi-block UnixFS file (raw leaves + one dag-pb root, the root last)."""
    return list(build_file([random_bytes(size, seed)], chunk_size=chunk))


async def read_car(stream: object) -> tuple[list[CID], dict[CID, bytes]]:
    reader = CarReader()
    blocks: dict[CID, bytes] = {}
    async for chunk in stream:  # type: ignore[attr-defined]
        for block in reader.feed(chunk):
            blocks[block.cid] = bytes(block.data)
    reader.close()
    return list(reader.roots or []), blocks


def test_version_and_identity(kubo: KuboDaemon) -> None:
    async def main() -> None:
        async with kubo.node() as node:
            assert (await node.version()).startswith("0.")
            ident = await node.identity()
            assert ident.peer_id == kubo.peer_id
            assert ident.agent_version.startswith("kubo/")
            assert any(a.startswith("/ip4/127.0.0.1/tcp/") for a in ident.addresses)

    asyncio.run(main())


def test_put_get_has_block(kubo: KuboDaemon) -> None:
    data = random_bytes(100_000, seed=1)

    async def main() -> None:
        async with kubo.node() as node:
            cid = await node.put_block(data, RAW)
            assert cid == CID.hash(RAW, data)
            assert await node.has_block(cid)
            assert await node.get_block(cid) == data
            assert await node.block_stat(cid) == len(data)
            absent = CID.hash(RAW, random_bytes(32, seed=2))
            assert not await node.has_block(absent)
            with pytest.raises(BlockNotFoundError) as info:
                await node.block_stat(absent, offline=True)
            assert info.value.cid == str(absent)

    asyncio.run(main())


def _car(roots: list[CID], blocks: list[Block], whole: bool) -> object:
    """A CAR as ``import_car`` takes it: given whole (a list: Kubo's goes in one send from a
    worker thread, never through httpx) or streamed."""
    return list(write_car(roots, blocks)) if whole else write_car(roots, blocks)


def _no_httpx_upload(node: KuboNode) -> None:
    async def refuse(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("a CAR given whole went through httpx")

    node.client.upload = refuse  # type: ignore[method-assign]


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "streamed"])
def test_import_car_then_export_car_round_trips_the_dag(kubo: KuboDaemon, whole: bool) -> None:
    blocks = small_dag(seed=3)
    root = blocks[-1].cid
    assert root.codec == DAG_PB and len(blocks) == 6

    async def main() -> None:
        async with kubo.node() as node:
            if whole:
                _no_httpx_upload(node)
            roots = await node.import_car(_car([root], blocks, whole))  # type: ignore[arg-type]
            assert roots == [root]
            assert root in await node.pins()
            got_roots, got = await read_car(node.export_car(root, offline=True))
            assert got_roots == [root]
            assert got == {b.cid: bytes(b.data) for b in blocks}
            # a UnixFS file Kubo can read back byte for byte
            content = b"".join([chunk async for chunk in node.cat(root)])
            assert content == random_bytes(5000, seed=3)
            await node.unpin(root)

    asyncio.run(main())


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "streamed"])
def test_import_car_with_a_missing_block_cannot_pin_its_root(kubo: KuboDaemon, whole: bool) -> None:
    blocks = small_dag(seed=4)
    root = blocks[-1].cid

    async def main() -> None:
        async with kubo.node() as node:
            with pytest.raises(BlockNotFoundError) as info:
                car = _car([root], blocks[1:], whole)
                await asyncio.wait_for(node.import_car(car), 20)  # type: ignore[arg-type]
            assert info.value.cid == str(blocks[0].cid)
            assert root not in await node.pins()

    asyncio.run(main())


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "streamed"])
def test_import_car_with_a_block_that_is_not_its_cid_is_refused(
    kubo: KuboDaemon, whole: bool
) -> None:
    blocks = small_dag(seed=6)
    root = blocks[-1].cid
    forged = Block(blocks[0].cid, bytes(len(blocks[0].data)))  # zeros under the leaf's CID

    async def main() -> None:
        async with kubo.node() as node:
            with pytest.raises(KuboCommandError):
                car = _car([root], [forged, *blocks[1:]], whole)
                await asyncio.wait_for(node.import_car(car, complete=True), 20)  # type: ignore[arg-type]
            assert root not in await node.pins()
            assert not await node.has_block(blocks[0].cid)

    asyncio.run(main())


def test_export_of_an_absent_root_offline_is_block_not_found(kubo: KuboDaemon) -> None:
    absent = CID.hash(RAW, random_bytes(32, seed=5))

    async def main() -> None:
        async with kubo.node() as node:
            with pytest.raises(BlockNotFoundError):
                await read_car(node.export_car(absent, offline=True))

    asyncio.run(main())


def test_add_only_hash_agrees_with_the_local_dag_builder(kubo: KuboDaemon) -> None:
    data = np.random.default_rng(6).integers(0, 255, (1 << 20) + 1, dtype=np.uint8)

    async def main() -> None:
        async with kubo.node() as node:
            assert await node.add_bytes([memoryview(data)], only_hash=True) == file_cid([data])

    asyncio.run(main())


def test_pin_unpin_pins(kubo: KuboDaemon) -> None:
    async def main() -> None:
        async with kubo.node() as node:
            cid = await node.put_block(random_bytes(64, seed=7), RAW)
            assert cid not in await node.pins()
            await node.pin(cid)
            assert cid in await node.pins()
            await node.unpin(cid)
            assert cid not in await node.pins()
            await node.unpin(cid)  # idempotent

    asyncio.run(main())


def test_pin_many_pins_every_cid_in_one_pin_add(kubo: KuboDaemon) -> None:
    """Blocks and a multi-block DAG, pinned recursively in one call (several ``arg``s)."""
    dag = small_dag(seed=71)

    async def main() -> None:
        async with kubo.node() as node:
            cids = [await node.put_block(random_bytes(64, seed=70 + i), RAW) for i in range(3)]
            (root,) = await node.import_car(write_car([dag[-1].cid], dag), pin_roots=False)
            await node.pin_many([])  # nothing to pin: no call
            assert not {*cids, root} & await node.pins()
            await node.pin_many([*cids, root])
            assert {*cids, root} <= await node.pins()

    asyncio.run(main())


def test_a_cid_already_pinned_recursively_is_not_pinned_again(kubo: KuboDaemon) -> None:
    """Kubo re-walks a pinned DAG on every ``pin/add``: a CID it already pins recursively
    costs one ``pin/ls``, never a ``pin/add``; one pinned directly, or not at all, still
    ends pinned recursively, wherever it stands in a batch."""
    dag = small_dag(seed=72)

    async def main() -> None:
        async with kubo.node() as node:
            (root,) = await node.import_car(write_car([dag[-1].cid], dag), pin_roots=True)
            direct = await node.put_block(random_bytes(64, seed=73), RAW)
            await node.pin(direct, recursive=False)
            loose = await node.put_block(random_bytes(64, seed=74), RAW)
            assert await node.pinned_recursively([root, direct, loose]) == {root}

            before = counts.REQUESTS["pin/add"]
            await node.pin_many([root])
            assert counts.REQUESTS["pin/add"] == before
            await node.pin_many([root, direct, loose])  # the unpinned two, in one pin/add
            assert counts.REQUESTS["pin/add"] == before + 1
            assert await node.pinned_recursively([root, direct, loose]) == {root, direct, loose}
            assert {root, direct, loose} <= await node.pins()

    asyncio.run(main())


def test_local_and_kubo_exchange_the_same_car(kubo: KuboDaemon, local_node: LocalNode) -> None:
    blocks = small_dag(seed=8)
    root = blocks[-1].cid

    async def main() -> None:
        async with kubo.node() as node:
            await local_node.import_car(write_car([root], blocks))
            assert await node.import_car(local_node.export_car(root)) == [root]
            other = LocalNode(local_node.path.parent / "other")
            assert await other.import_car(node.export_car(root)) == [root]
            assert await other.get_block(root) == bytes(blocks[-1].data)
            await node.unpin(root)

    asyncio.run(main())


def test_swarm_connect(kubo_factory: Factory) -> None:
    a, b = kubo_factory(2)

    async def main() -> None:
        async with a.node() as na, b.node() as nb:
            assert await na.swarm_peers() == []
            await na.swarm_connect(b.loopback_addr())
            assert b.peer_id in await na.swarm_peers()
            assert a.peer_id in await nb.swarm_peers()
            # the connected peer serves blocks over bitswap
            cid = await na.put_block(random_bytes(1000, seed=9), RAW)
            assert await asyncio.wait_for(nb.get_block(cid), 20) == random_bytes(1000, seed=9)

    asyncio.run(main())


def test_pubsub_between_two_daemons(kubo_factory: Factory) -> None:
    a, b = kubo_factory(2, connect=True)
    topic = "gradstore/v1/test/gradients"
    big = random_bytes(MAX_PUBSUB_DATA - len(topic), seed=10)
    quick = [f"announce {i}".encode() for i in range(50)]

    async def main() -> None:
        async with a.node() as na, b.node() as nb, nb.subscribe(topic) as sub:
            assert topic in await nb.pubsub_topics()
            await na.wait_for_topic_peers(topic, [b.peer_id])
            # gossipsub may still drop a first message while its mesh forms (gradstore's
            # peers re-announce for that reason): repeat it until one arrives
            for _ in range(10):
                await na.publish(topic, b"\x00first\xff")
                try:
                    first = await sub.get(3)
                    break
                except TimeoutError:
                    continue

            assert (first.topic, first.data, first.from_peer) == (
                topic,
                b"\x00first\xff",
                a.peer_id,
            )
            await na.publish(topic, big)

            async def next_new() -> bytes:  # a repeat of the first message may come late
                while (data := (await sub.get(20)).data) == b"\x00first\xff":
                    pass
                return data

            assert await next_new() == big
            await asyncio.gather(*(na.publish(topic, m) for m in quick))
            got = [await next_new() for _ in quick]
            assert sorted(got) == sorted(quick)
            with pytest.raises(LimitExceededError):
                await na.publish(topic, bytes(MAX_PUBSUB_DATA))

    asyncio.run(main())


def test_authorization_header_reaches_a_protected_api(kubo_binary: object) -> None:
    secret = "gradstore-test-secret"
    auth = {"gradstore": {"AuthSecret": f"bearer:{secret}", "AllowedPaths": ["/api/v0"]}}
    with KuboDaemon(kubo_binary, config={"API.Authorizations": auth}) as daemon:  # type: ignore[arg-type]

        async def main() -> None:
            async with KuboNode(daemon.api_url, retries=0) as anonymous:
                with pytest.raises(KuboCommandError) as info:
                    await anonymous.version()
                assert info.value.status in (401, 403)
            async with KuboNode(daemon.api_url, auth=f"Bearer {secret}") as node:
                assert (await node.version()).startswith("0.")
            async with daemon.node() as node:  # the launcher knows the secret it configured
                assert (await node.identity()).peer_id == daemon.peer_id

        asyncio.run(main())


def test_small_uploads_keep_their_connection(
    kubo: KuboDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish, a block/put or a dag/put body of known size goes out with Content-Length:
    Kubo closed the connection after most chunked uploads, so every status or record the
    coordinator sent paid a new TCP connection (a stepped round sends hundreds)."""
    connects = 0
    create_connection = asyncio.BaseEventLoop.create_connection

    async def counted(self: asyncio.BaseEventLoop, *args: object, **kwargs: object) -> object:
        nonlocal connects
        connects += 1
        return await create_connection(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(asyncio.BaseEventLoop, "create_connection", counted)

    async def main() -> int:
        async with kubo.node() as node:
            await node.version()  # the first connection
            before = connects
            for i in range(10):
                await node.publish("gradstore-test-keepalive", b"status %d" % i)
                await node.put_block(random_bytes(300, seed=i), RAW)
                data = random_bytes(200, seed=100 + i)
                await node.dag_put(Block(CID.hash(RAW, data), data), pin=False)
            return connects - before

    assert asyncio.run(main()) <= 1


def test_cat_into_tells_its_progress_every_64_kib_and_at_the_end(kubo: KuboDaemon) -> None:
    # Kubo sends cat in 4 KiB chunks: a progress call per chunk (a lock and a check in the
    # caller's hasher) cost about 0.25 ms of CPU a MiB
    data = np.random.default_rng(5).bytes(3 * 1024 * 1024 + 1000)
    blocks = list(build_file([memoryview(data)]))
    root = blocks[-1].cid

    async def go() -> None:
        async with kubo.node() as node:
            await node.import_car(write_car([root], blocks), pin_roots=False)
            told: list[int] = []
            out = bytearray(len(data))
            assert await node.cat_into(root, out, progress=told.append) == len(data)
            assert bytes(out) == data
            assert told[-1] == len(data) and told == sorted(told)
            assert len(told) <= len(data) // (64 * 1024) + 1, len(told)

    asyncio.run(go())
