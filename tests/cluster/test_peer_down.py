"""A cluster peer that is down while a round closes (SIGKILLed; not the coordinator's, and its
Kubo still up) does not lose the round: the aggregate and the record reach replication_min on
the two peers left, before the round is reported closed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gradstore.node.cluster import ClusterClient, ClusterNode, ClusterPins, Replication
from gradstore.peer import Peer
from tests.conftest import KuboCluster
from tests.coordinator.harness import (
    World,
    gradients,
    make_job,
    publish_all,
    start_coordinator,
    wait_subscribed,
)


def test_a_cluster_peer_down_at_close_does_not_lose_the_round(
    kubo_cluster: KuboCluster, tmp_path: Path
) -> None:
    config, coord, peers = make_job(3, rounds=1)
    kubos, cluster = kubo_cluster.kubos, kubo_cluster.peers
    live = {cluster[0].peer_id, cluster[1].peer_id}

    async def go() -> None:
        pins = ClusterPins(ClusterClient(cluster[0].api_url), Replication(2, 2, wait_s=10))
        coord_node = ClusterNode(kubos[0].node(), pins)
        carriers = [kubos[1].node(), kubos[2].node()]
        w = World(config, coord, peers, coord_node, [carriers[i % 2] for i in range(3)])  # type: ignore[arg-type]
        try:
            _, task = start_coordinator(w, tmp_path / "state", close_retry_s=60)
            await wait_subscribed(w)
            cluster[2].kill()  # down from before the inputs until after the close
            async with Peer(config, carriers[0]) as listener:
                await publish_all(w, 0, gradients(3, 0), [1, 2, 3])
                result = await listener.await_result(0, timeout=120)
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "closed", outcome.reason
            for cid in (result.record, result.cid):  # reported closed: already at the minimum
                status = await pins.client.status(cid)
                holders = {p for p, s in status.peers.items() if s == "pinned"}
                assert holders == live, status.describe()
        finally:
            await coord_node.aclose()
            for n in carriers:
                await n.aclose()

    asyncio.run(go())
