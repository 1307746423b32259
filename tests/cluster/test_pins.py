"""Pins through a real 3-peer IPFS Cluster: held at replication_min, dropped by unpin, and
a minimum the cluster cannot reach is a ``ReplicationError``."""

from __future__ import annotations

import asyncio

import pytest

from gradstore.dag import cbor
from gradstore.dag.cid import CID, DAG_CBOR
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


def test_a_direct_pin_keeps_the_one_block_not_what_it_links(kubo_cluster: KuboCluster) -> None:
    # a record links a round's inputs and outputs, pinned apart; pinned recursively, every
    # cluster peer fetched and kept all of it (IPFS Cluster pins /pins/{cid} recursively,
    # whatever the mode), and a link nobody holds kept the pin from ever completing
    absent = CID.hash(DAG_CBOR, b"a block no node of the cluster holds")
    record = cbor.encode({"inputs": [absent], "round": 7})

    async def main() -> None:
        node = _node(kubo_cluster, 0, Replication(2, 2, wait_s=20))
        try:
            cid = await node.put_block(record, DAG_CBOR)
            await node.pin(cid, recursive=False)  # ReplicationError if pinned recursively
            status = await node.pins_.client.status(cid)
            holders = [p for p in kubo_cluster.peers if status.peers.get(p.peer_id) == "pinned"]
            assert len(holders) >= 2, status.describe()
            for peer in holders:
                kubo = kubo_cluster.kubos[kubo_cluster.peers.index(peer)]
                async with kubo.node() as holder:
                    listed = await holder.client.call(
                        "pin/ls", [("arg", str(cid)), ("type", "direct")]
                    )
                    assert str(cid) in listed.decode()
            await node.unpin(cid)
        finally:
            await node.aclose()

    asyncio.run(main())
