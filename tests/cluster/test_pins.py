"""Pins through a real 3-peer IPFS Cluster: held at replication_min, dropped by unpin, and
a minimum the cluster cannot reach is a ``ReplicationError``."""

from __future__ import annotations

import asyncio

import pytest

from gradstore.dag.cid import DAG_CBOR
from gradstore.errors import ReplicationError
from gradstore.node.cluster import ClusterClient, ClusterNode, ClusterPins, Replication
from tests.conftest import KuboCluster


def _node(cluster: KuboCluster, i: int, replication: Replication) -> ClusterNode:
    client = ClusterClient(cluster.peers[i].api_url)
    return ClusterNode(cluster.kubos[i].node(), ClusterPins(client, replication))


def test_a_pin_returns_once_replication_min_peers_hold_it(kubo_cluster: KuboCluster) -> None:
    async def main() -> None:
        node = _node(kubo_cluster, 0, Replication(2, 2, wait_s=30))
        try:
            cid = await node.put_block(b"\xa1\x61a\x01", DAG_CBOR)
            await node.pin(cid, recursive=False)
            status = await node.pins_.client.status(cid)
            assert status.pinned >= 2, status.describe()
            holders = {
                kubo_cluster.peers.index(p)
                for p in kubo_cluster.peers
                if status.peers.get(p.peer_id) == "pinned"
            }
            for i in holders:  # each holder's Kubo pins it itself
                async with kubo_cluster.kubos[i].node() as holder:
                    assert cid in await holder.pins() or await holder.has_block(cid)
            await node.unpin(cid)
            assert (await node.pins_.client.status(cid)).pinned == 0
        finally:
            await node.aclose()

    asyncio.run(main())


def test_a_minimum_above_the_peer_count_is_a_replication_error(
    kubo_cluster: KuboCluster,
) -> None:
    async def main() -> None:
        node = _node(kubo_cluster, 0, Replication(4, 4, wait_s=5))
        try:
            cid = await node.put_block(b"\xa1\x61b\x02", DAG_CBOR)
            with pytest.raises(ReplicationError, match="not enough peers") as caught:
                await node.pin(cid, recursive=False)
            assert caught.value.status == 503  # transient: a close retries it
        finally:
            await node.aclose()

    asyncio.run(main())
