"""The lists block of a long status (refusal reasons too long for one message) is pinned on
the coordinator's real Kubo, once however often the status repeats: ``_publish`` only put it,
so Kubo's garbage collection could drop what peers still had to read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gradstore.coordinator import Coordinator
from gradstore.dag import CID
from gradstore.messages import SigningKey, Status, encode_fitted
from gradstore.node import KuboDaemon, KuboNode
from tests.coordinator.harness import make_job

RUN = "a" * 26


def long_status(config: Any) -> Status:
    """Every peer refused with a long reason (at most 300 bytes each): with 80 peers the
    lists outgrow one message and move to a linked block."""
    dids = list(config.roster)
    every, none = config.roster.bitmap(dids), config.roster.bitmap(())
    reasons = tuple(f"too-large: {'x' * 250} {i}" for i in range(len(dids)))
    return Status(config.job, RUN, 0, every, none, every, reasons, 1)


def lists_cid(status: Status, key: SigningKey) -> CID:
    _, block = encode_fitted(status, key)
    assert block is not None, "the status fits one message: the test needs a longer one"
    return block[0]


class CountingNode:
    """Real Kubo, with its ``pin_many`` calls counted."""

    def __init__(self, node: KuboNode) -> None:
        self._node = node
        self.pinned: list[list[CID]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    async def pin_many(self, cids: list[CID]) -> None:
        self.pinned.append(list(cids))
        await self._node.pin_many(cids)


def test_a_long_statuss_lists_block_is_pinned_once(kubo: KuboDaemon, tmp_path: Path) -> None:
    config, coord, _ = make_job(80)
    status = long_status(config)
    cid = lists_cid(status, coord)

    async def go() -> None:
        async with kubo.node() as node:
            counting = CountingNode(node)
            coordinator = Coordinator(config, coord, counting, tmp_path / "state")  # type: ignore[arg-type]
            assert cid not in await node.pins()
            await coordinator._publish(status)
            assert cid in await node.pins()
            assert await node.get_block(cid) == encode_fitted(status, coord)[1][1]  # type: ignore[index]
            for _ in range(3):  # the beacon repeats the status: same block, pinned already
                await coordinator._publish(status)
            assert counting.pinned == [[cid]]

    asyncio.run(go())
