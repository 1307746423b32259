"""A stepped round (``[[steps]]``) whose coordinator pins through a real 3-peer IPFS Cluster
at replication 2: when the round's result is heard, every step record, every step output,
the model output and the round/5 record are already pinned on 2 peers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gradstore.coordinator import Coordinator
from gradstore.dag import CID
from gradstore.node.cluster import ClusterClient, ClusterNode, ClusterPins, Replication
from tests.conftest import KuboCluster
from tests.coordinator.harness import World, wait_subscribed
from tests.coordinator.steps_harness import (
    announce,
    listening,
    run_id,
    step_gradients,
    stepped_job,
)


def test_a_stepped_round_is_pinned_at_replication_min(
    kubo_cluster: KuboCluster, tmp_path: Path
) -> None:
    config, coord, peers = stepped_job()
    grads, samples = step_gradients(3, 0), [5, 6, 7]
    kubos = kubo_cluster.kubos

    async def go() -> None:
        pins = ClusterPins(ClusterClient(kubo_cluster.peers[0].api_url), Replication(2, 2, 30))
        coord_node = ClusterNode(kubos[0].node(), pins)
        carriers = [kubos[1].node(), kubos[2].node()]
        w = World(config, coord, peers, coord_node, [carriers[i % 2] for i in range(3)])  # type: ignore[arg-type]
        stop = asyncio.Event()
        coordinator = Coordinator(
            config, coord, coord_node, tmp_path / "state", rebroadcast_s=0.5, linger_s=0
        )
        task = asyncio.create_task(coordinator.run(stop))
        try:
            await wait_subscribed(w)
            async with listening(w, carriers[0]) as heard:
                run = await run_id(coordinator)
                for step in ("head", "body"):
                    for i in range(3):
                        await announce(w, heard, i, 0, step, grads[i][step], samples[i], run)
                head, body = await heard.result(0, "head"), await heard.result(0, "body")
                whole = await heard.result(0, None)
            await asyncio.wait_for(task, 60)
            (outcome,) = coordinator.outcomes
            assert outcome.status == "closed" and str(outcome.record) == whole.record
            kept = {
                "head record": head.record, "head output": head.cid,
                "body record": body.record, "body output": body.cid,
                "round/5 record": whole.record, "model output": whole.cid,
            }  # fmt: skip
            for what, cid in kept.items():
                status = await pins.client.status(CID.parse(cid))
                assert status.pinned >= 2, f"{what}: {status.describe()}"
        finally:
            stop.set()
            await asyncio.gather(task, return_exceptions=True)
            await coord_node.aclose()
            for n in carriers:
                await n.aclose()

    asyncio.run(go())
