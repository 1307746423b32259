"""LocalNode: the embedded node keeps Kubo's semantics (CIDs, verification, pins, pubsub)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from gradstore.dag import Block, CarReader, build_file, write_car
from gradstore.dag.cid import CID, DAG_PB, RAW
from gradstore.errors import BlockNotFoundError, DAGError, IntegrityError, LimitExceededError
from gradstore.node import MAX_PUBSUB_DATA, LocalNode, Node

SEED = 424242


def random_bytes(n: int, seed: int = SEED) -> bytes:
    return np.random.default_rng(seed).bytes(n)


def small_dag(seed: int = SEED) -> list[Block]:
    return list(build_file([random_bytes(5000, seed)], chunk_size=1024))


def test_local_node_implements_the_node_protocol(local_node: LocalNode) -> None:
    assert isinstance(local_node, Node)
    assert local_node.name == f"local {local_node.path}"


def test_put_get_has_block(local_node: LocalNode) -> None:
    data = random_bytes(10_000, seed=1)

    async def main() -> None:
        cid = await local_node.put_block(memoryview(np.frombuffer(data, dtype=np.uint8)), RAW)
        assert cid == CID.hash(RAW, data)
        assert await local_node.has_block(cid)
        assert await local_node.get_block(cid) == data
        absent = CID.hash(RAW, b"absent")
        assert not await local_node.has_block(absent)
        with pytest.raises(BlockNotFoundError) as info:
            await local_node.get_block(absent)
        assert info.value.cid == str(absent)

    asyncio.run(main())


def test_a_corrupted_block_file_is_an_integrity_error(local_node: LocalNode) -> None:
    async def main() -> None:
        cid = await local_node.put_block(b"original bytes", RAW)
        (local_node.blocks_dir / str(cid)).write_bytes(b"tampered bytes")
        with pytest.raises(IntegrityError) as info:
            await local_node.get_block(cid)
        assert info.value.cid == str(cid)
        with pytest.raises(IntegrityError):
            [chunk async for chunk in local_node.export_car(cid)]

    asyncio.run(main())


def test_import_car_refuses_a_block_that_does_not_match_its_cid(local_node: LocalNode) -> None:
    cid = CID.hash(RAW, b"claimed")

    async def main() -> None:
        with pytest.raises(IntegrityError):
            await local_node.import_car(write_car([cid], [Block(cid, b"actual")]))
        assert not await local_node.has_block(cid)

    asyncio.run(main())


def test_import_car_refuses_a_truncated_stream(local_node: LocalNode) -> None:
    blocks = small_dag(seed=2)
    car = b"".join(bytes(p) for p in write_car([blocks[-1].cid], blocks))

    async def main() -> None:
        with pytest.raises(DAGError):
            await local_node.import_car([car[:-10]])

    asyncio.run(main())


def test_import_then_export_round_trips_and_pins(local_node: LocalNode) -> None:
    blocks = small_dag(seed=3)
    root = blocks[-1].cid
    assert root.codec == DAG_PB

    async def main() -> None:
        pieces = list(write_car([root], blocks))

        async def stream() -> AsyncIterator[bytes | memoryview]:
            for piece in pieces:
                yield piece

        assert await local_node.import_car(stream()) == [root]
        assert await local_node.pins() == {root}
        reader = CarReader()
        got: dict[CID, bytes] = {}
        async for chunk in local_node.export_car(root):
            for block in reader.feed(chunk):
                got[block.cid] = bytes(block.data)
        reader.close()
        assert reader.roots == [root]
        assert got == {b.cid: bytes(b.data) for b in blocks}

    asyncio.run(main())


def test_pinning_an_incomplete_dag_names_the_missing_block(local_node: LocalNode) -> None:
    blocks = small_dag(seed=4)
    root = blocks[-1].cid

    async def main() -> None:
        with pytest.raises(BlockNotFoundError) as info:
            await local_node.import_car(write_car([root], blocks[1:]))
        assert info.value.cid == str(blocks[0].cid)
        assert root not in await local_node.pins()
        # the blocks that were there are kept; importing without pinning succeeds
        assert await local_node.import_car(write_car([root], blocks[1:]), pin_roots=False) == [root]

    asyncio.run(main())


def test_pins_persist_and_unpin_is_idempotent(tmp_path: Path) -> None:
    async def main() -> None:
        node = LocalNode(tmp_path)
        a = await node.put_block(b"a", RAW)
        b = await node.put_block(b"b", RAW)
        await node.pin(a)
        await node.pin(b)
        await node.pin(a)
        assert await LocalNode(tmp_path).pins() == {a, b}
        assert (tmp_path / "pins").read_text().splitlines() == [str(a), str(b)]
        await node.unpin(a)
        await node.unpin(a)
        assert await LocalNode(tmp_path).pins() == {b}

    asyncio.run(main())


def test_block_over_the_size_limit_is_refused(local_node: LocalNode) -> None:
    async def main() -> None:
        with pytest.raises(LimitExceededError):
            await local_node.put_block(bytes((2 << 20) + 1), RAW)

    asyncio.run(main())


def test_pubsub_reaches_every_node_of_the_same_directory(tmp_path: Path) -> None:
    topic = "gradstore/v1/job/gradients"
    big = random_bytes(MAX_PUBSUB_DATA - len(topic), seed=5)

    async def main() -> None:
        a, b = LocalNode(tmp_path / "shared"), LocalNode(tmp_path / "shared")
        stranger = LocalNode(tmp_path / "elsewhere")
        async with b.subscribe(topic) as sub, stranger.subscribe(topic) as other:
            await a.publish(topic, b"\x00hello\xff")
            first = await sub.get(1)
            assert (first.topic, first.data) == (topic, b"\x00hello\xff")
            assert first.from_peer == (await a.identity()).peer_id
            await a.publish(topic, big)
            assert (await sub.get(1)).data == big
            quick = [f"m{i}".encode() for i in range(50)]
            await asyncio.gather(*(a.publish(topic, m) for m in quick))
            assert sorted([(await sub.get(1)).data for _ in quick]) == sorted(quick)
            with pytest.raises(TimeoutError):
                await other.get(0.05)
            with pytest.raises(LimitExceededError):
                await a.publish(topic, bytes(MAX_PUBSUB_DATA))

    asyncio.run(main())


def test_subscription_iterates_until_closed(local_node: LocalNode) -> None:
    async def main() -> list[bytes]:
        sub = local_node.subscribe("t")
        await sub.ready()
        await local_node.publish("t", b"1")
        await local_node.publish("t", b"2")
        await sub.aclose()
        return [m.data async for m in sub]

    assert asyncio.run(main()) == [b"1", b"2"]


def test_pin_many_pins_them_all_or_names_the_missing_block(local_node: LocalNode) -> None:
    whole, broken = small_dag(seed=5), small_dag(seed=6)

    async def main() -> None:
        (root,) = await local_node.import_car(write_car([whole[-1].cid], whole), pin_roots=False)
        (bad,) = await local_node.import_car(
            write_car([broken[-1].cid], broken[1:]), pin_roots=False
        )
        with pytest.raises(BlockNotFoundError) as info:
            await local_node.pin_many([root, bad])
        assert info.value.cid == str(broken[0].cid)
        assert await local_node.pins() == set()
        await local_node.pin_many([root, whole[0].cid])
        assert await local_node.pins() == {root, whole[0].cid}

    asyncio.run(main())
