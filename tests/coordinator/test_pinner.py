"""Verified inputs pinned in batches on real Kubo (issue 19, step overhead): the coordinator
pinned each input with its own ``pin/add`` (about 320 a stepped round of 64 steps); the
``BatchPinner`` pins every input ready in one call, and a batch that fails is pinned again
one CID at a time so each input hears its own outcome."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from gradstore.coordinator.pinner import BatchPinner
from gradstore.dag import CID, build_file, write_car
from gradstore.format import Gradient
from gradstore.node import KuboDaemon, KuboNode
from gradstore.store import GradientStore

pytestmark = pytest.mark.kubo


class CountingNode:
    """Real Kubo, with its ``pin/add`` calls counted (one per ``pin`` or ``pin_many``)."""

    def __init__(self, node: KuboNode) -> None:
        self._node = node
        self.pin_adds = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    async def pin(self, cid: CID, *, recursive: bool = True) -> None:
        self.pin_adds += 1
        await self._node.pin(cid, recursive=recursive)

    async def pin_many(self, cids: list[CID]) -> None:
        self.pin_adds += 1
        await self._node.pin_many(cids)


async def _documents(node: KuboNode, n: int) -> list[CID]:
    """``n`` gradient documents stored unpinned (as a peer's are, fetched by the coordinator)."""
    rng = np.random.default_rng(19)
    store = GradientStore(node)
    return [
        await store.put(
            Gradient({"w": rng.standard_normal(64 << 10).astype(np.float32)}), pin=False
        )
        for _ in range(n)
    ]


def test_inputs_verified_together_are_pinned_in_fewer_calls_than_inputs(kubo: KuboDaemon) -> None:
    n = 24

    async def main() -> tuple[int, set[CID], list[CID]]:
        async with kubo.node() as node:
            cids = await _documents(node, n)
            assert not set(cids) & await node.pins()
            counting = CountingNode(node)
            pinner = BatchPinner(counting)  # type: ignore[arg-type]
            await asyncio.gather(*(pinner.pin(cid) for cid in cids))
            await pinner.pin(cids[0])  # alone: pinned again at once, no one to wait for
            return counting.pin_adds, await node.pins(), cids

    calls, pins, cids = asyncio.run(main())
    assert set(cids) <= pins  # pin/ls: every input pinned
    assert calls == 2 < n + 1  # one pin/add for the 24 ready together, one for the last


def test_a_batch_with_an_input_that_cannot_be_pinned_pins_the_others_and_fails_that_one(
    kubo: KuboDaemon,
) -> None:
    """A DAG missing a block (Kubo looks for it on the network): the batch times out, each
    input is pinned alone, the good ones are, and the bad one's caller hears why."""
    blocks = list(build_file([np.random.default_rng(5).bytes(5000)], chunk_size=1024))

    async def main() -> tuple[list[Any], set[CID], list[CID], int]:
        async with kubo.node() as node:
            good = await _documents(node, 2)
            (bad,) = await node.import_car(write_car([blocks[-1].cid], blocks[1:]), pin_roots=False)
            counting = CountingNode(node)
            pinner = BatchPinner(counting, timeout_s=2.0)  # type: ignore[arg-type]
            got = await asyncio.gather(
                *(pinner.pin(cid) for cid in (good[0], bad, good[1])), return_exceptions=True
            )
            return got, await node.pins(), [*good, bad], counting.pin_adds

    got, pins, (first, second, bad), calls = asyncio.run(main())
    assert got[0] is None and got[2] is None and isinstance(got[1], TimeoutError)
    assert {first, second} <= pins and bad not in pins
    assert calls == 1 + 3  # the batch, then each alone


def test_a_caller_cancelled_while_it_pins_a_batch_leaves_the_others_to_a_new_turn(
    kubo: KuboDaemon,
) -> None:
    """The pinning is done by a waiting caller (no task of its own). Cancelled mid-batch (a
    fetch attempt whose step closed), it takes its own CID out and puts the rest back: the
    next caller pins them at once, not after the node's timeout."""
    blocks = list(build_file([np.random.default_rng(6).bytes(5000)], chunk_size=1024))

    async def main() -> tuple[float, set[CID], CID, CID]:
        async with kubo.node() as node:
            (good,) = await _documents(node, 1)
            (bad,) = await node.import_car(write_car([blocks[-1].cid], blocks[1:]), pin_roots=False)
            pinner = BatchPinner(node, timeout_s=60.0)  # type: ignore[arg-type]
            leading = asyncio.create_task(pinner.pin(bad))  # leads the batch [bad, good]
            waiting = asyncio.create_task(pinner.pin(good))
            await asyncio.sleep(1.0)  # Kubo looks for bad's missing block
            assert not waiting.done()
            started = asyncio.get_running_loop().time()
            leading.cancel()
            await asyncio.wait_for(waiting, 10)
            took = asyncio.get_running_loop().time() - started
            assert leading.cancelled()
            return took, await node.pins(), good, bad

    took, pins, good, bad = asyncio.run(main())
    assert good in pins and bad not in pins
    assert took < 5.0, took
