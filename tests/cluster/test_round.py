"""A round whose coordinator pins through a real 3-peer IPFS Cluster at replication 2: the
coordinator's machine is lost (its Kubo and cluster peer SIGKILLed) and the round's history
is still whole on the two others; a cluster short of replication_min fails the round with
the reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gradstore.cli._main import main
from gradstore.dag import CID
from gradstore.messages import decode_record
from gradstore.node.cluster import ClusterClient, ClusterNode, ClusterPins, Replication
from gradstore.peer import Peer
from gradstore.store import GradientStore
from tests.conftest import KuboCluster
from tests.coordinator.harness import (
    World,
    gradients,
    make_job,
    publish_all,
    start_coordinator,
    wait_subscribed,
)


def test_a_round_survives_the_loss_of_its_coordinators_machine(
    kubo_cluster: KuboCluster, tmp_path: Path
) -> None:
    config, coord, peers = make_job(3, rounds=1)
    kubos = kubo_cluster.kubos
    head: list[CID] = []

    async def run_round() -> None:
        pins = ClusterPins(ClusterClient(kubo_cluster.peers[0].api_url), Replication(2, 2, 30))
        coord_node = ClusterNode(kubos[0].node(), pins)
        carriers = [kubos[1].node(), kubos[2].node()]
        w = World(config, coord, peers, coord_node, [carriers[i % 2] for i in range(3)])  # type: ignore[arg-type]
        try:
            _, task = start_coordinator(w, tmp_path / "state")
            await wait_subscribed(w)
            async with Peer(config, carriers[0]) as listener:
                await publish_all(w, 0, gradients(3, 0), [1, 2, 3])
                result = await listener.await_result(0, timeout=60)
            await task
            record = decode_record(await carriers[0].get_block(result.record), cid=result.record)
            # the close waited for these; the inputs were submitted: wait for them here
            for cid in (result.record, result.cid):
                assert (await pins.client.status(cid)).pinned >= 2
            for item in record.inputs:
                await pins.wait(item.gradient)
            head.append(result.record)
            head.extend([result.cid, *(i.gradient for i in record.inputs)])
        finally:
            await coord_node.aclose()
            for n in carriers:
                await n.aclose()

    asyncio.run(run_round())
    kubo_cluster.kill(0)  # the coordinator's machine: its Kubo and its cluster peer

    async def fetch_from_survivors() -> None:
        for daemon in kubos[1:]:
            async with daemon.node() as node:
                record_cid, output, *inputs = head
                await asyncio.wait_for(node.get_block(record_cid), 30)
                store = GradientStore(node)
                for cid in (output, *inputs):
                    await asyncio.wait_for(store.get(cid), 30)

    asyncio.run(fetch_from_survivors())
    assert main(["audit", "history", str(head[0]), "--api", kubos[1].api_url]) == 0


def test_a_cluster_short_of_replication_min_fails_the_round_with_the_reason(
    kubo_cluster: KuboCluster, tmp_path: Path
) -> None:
    config, coord, peers = make_job(2, rounds=1)
    kubos = kubo_cluster.kubos

    async def go() -> None:
        pins = ClusterPins(ClusterClient(kubo_cluster.peers[0].api_url), Replication(4, 4, 1))
        coord_node = ClusterNode(kubos[0].node(), pins)
        carriers = [kubos[1].node(), kubos[2].node()]
        w = World(config, coord, peers, coord_node, carriers)  # type: ignore[arg-type]
        try:
            _, task = start_coordinator(w, tmp_path / "state", close_retry_s=3)
            await wait_subscribed(w)
            await publish_all(w, 0, gradients(2, 0), [1, 1])
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "failed"
            assert outcome.reason is not None and outcome.reason.startswith("replication: ")
            assert "not enough peers" in outcome.reason
        finally:
            await coord_node.aclose()
            for n in carriers:
                await n.aclose()

    asyncio.run(go())
