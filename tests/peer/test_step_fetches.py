"""A peer fetches the aggregates of a stepped round's closed steps concurrently (issue 19):
a step whose aggregate is slow to come holds up no other step's result in
``step_results``. Against the scripted coordinator on real Kubo."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradstore.dag import CID
from gradstore.format import Gradient
from gradstore.node import KuboNode
from gradstore.peer import AggregateResult, Peer, StepFailed
from gradstore.store import GradientStore

from .scripted import STEP_TENSORS, ScriptedCoordinator, record_cid, stepped_job

pytestmark = pytest.mark.kubo


class _HeldBlock(KuboNode):
    """Real Kubo, but getting the block ``held`` waits until ``release`` is set (``asked`` is
    set once it waits): that aggregate's fetch stands still."""

    def __init__(self, api_url: str) -> None:
        super().__init__(api_url)
        self.held: CID | None = None
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def get_block(self, cid: CID) -> bytes:
        if self.held is not None and cid.to_v1() == self.held.to_v1():
            self.asked.set()
            await self.release.wait()
        return await super().get_block(cid)


async def _aggregate(node: KuboNode, step: str, value: float) -> CID:
    tensors = {n: np.full(3, value, np.float32) for n in STEP_TENSORS[step]}
    return await GradientStore(node).put(Gradient(tensors, {"kind": "aggregate", "step": step}))


def test_a_slow_aggregate_fetch_holds_up_no_other_steps_result(kubo_factory) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    dids = [k.did for k in keys]

    async def go() -> None:
        coord_node, peer_node = daemons[0].node(), _HeldBlock(daemons[1].api_url)
        try:
            async with (
                ScriptedCoordinator(config, coord, coord_node).running() as c,
                Peer(config, peer_node, keys[0], coordinator_timeout_s=20) as peer,
            ):
                await coord_node.wait_for_topic_peers(config.results_topic, 1, timeout=15)
                head = await _aggregate(coord_node, "head", 1.0)
                body = await _aggregate(coord_node, "body", 2.0)
                peer_node.held = head
                got: list[AggregateResult | StepFailed] = []

                async def consume() -> None:
                    async for item in peer.step_results(0, timeout=30):
                        got.append(item)

                consuming = asyncio.create_task(consume())
                try:
                    await c.result(0, "head", head, dids, record_cid("head"))
                    await asyncio.wait_for(peer_node.asked.wait(), 15)  # head's fetch waits
                    await c.result(0, "body", body, dids[:1], record_cid("body"))
                    await c.status(0, "embed", failed="quorum not met")
                    async with asyncio.timeout(15):  # yielded while head's fetch stands still
                        while len(got) < 2:
                            await asyncio.sleep(0.05)
                    assert sorted(getattr(i, "step", "") for i in got) == ["body", "embed"]
                    assert not consuming.done()
                    peer_node.release.set()
                    await asyncio.wait_for(consuming, 15)
                finally:
                    peer_node.release.set()
                    consuming.cancel()
                    await asyncio.gather(consuming, return_exceptions=True)
                by_step = {i.step: i for i in got}
                assert len(got) == 3 and got[-1] is by_step["head"]
                assert by_step["embed"] == StepFailed(0, "embed", "quorum not met")
                assert isinstance(by_step["body"], AggregateResult)
                assert by_step["body"].cid == body
                last = by_step["head"]
                assert isinstance(last, AggregateResult) and last.cid == head
                np.testing.assert_array_equal(last.gradient.tensors["head.w"], np.ones(3))
        finally:
            await coord_node.aclose()
            await peer_node.aclose()

    asyncio.run(go())
