"""A long status's lists block goes through the coordinator's node, so a real 3-peer IPFS
Cluster keeps it at replication_min like the round's other blocks (it was only put)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gradstore.coordinator import Coordinator
from gradstore.node.cluster import ClusterClient, ClusterNode, ClusterPins, Replication
from tests.conftest import KuboCluster
from tests.coordinator.harness import make_job
from tests.coordinator.test_lists_pinned import lists_cid, long_status


def test_a_long_statuss_lists_block_is_pinned_by_the_cluster(
    kubo_cluster: KuboCluster, tmp_path: Path
) -> None:
    config, coord, _ = make_job(80)
    status = long_status(config)
    cid = lists_cid(status, coord)

    async def go() -> None:
        pins = ClusterPins(ClusterClient(kubo_cluster.peers[0].api_url), Replication(2, 2, 30))
        node = ClusterNode(kubo_cluster.kubos[0].node(), pins)
        try:
            coordinator = Coordinator(config, coord, node, tmp_path / "state")
            await coordinator._publish(status)
            held = await pins.wait(cid)  # submitted, not waited on: the status went out
            assert held.pinned >= 2, held.describe()
        finally:
            await node.aclose()

    asyncio.run(go())
