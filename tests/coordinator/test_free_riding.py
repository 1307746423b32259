"""Free-riding and stale replays against a coordinator on real Kubo daemons: a peer announcing
a document that is not its own, or not this round's, is excluded with the reason.

Every CID is visible on the gradients topic; before documents were bound to the
announcements that name them, each of these peers was aggregated with someone else's work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from gradstore.coordinator import Coordinator
from gradstore.coordinator.rounds import PeerState
from gradstore.dag import CID
from gradstore.format import Gradient
from gradstore.job import InputsConfig, JobConfig
from gradstore.messages import Announce, SigningKey, decode_record, encode_message
from gradstore.node import KuboNode
from gradstore.peer import Peer
from gradstore.store import GradientStore

from .harness import World, gradients, make_job, wait_subscribed, world

pytestmark = pytest.mark.kubo


def _coordinator(w: World, state: Path) -> tuple[Coordinator, asyncio.Task[Any]]:
    coordinator = Coordinator(
        w.config, w.coord_key, w.coord_node, state, rebroadcast_s=0.5, linger_s=0
    )
    return coordinator, asyncio.create_task(coordinator.run())


async def _running(coordinator: Coordinator, round_: int = 0) -> None:
    while not coordinator.run_id or coordinator.round < round_:
        await asyncio.sleep(0.01)


async def _announce(
    coordinator: Coordinator,
    node: KuboNode,
    peer: SigningKey,
    cid: CID,
    round_: int = 0,
    num_samples: int = 1,
) -> None:
    """A hand-made announcement, repeated until the coordinator has accepted it (pubsub may
    drop a message; an exact repeat costs the coordinator nothing)."""
    while True:
        ann = Announce(
            job=coordinator.config.job,
            run=coordinator.run_id,
            round=round_,
            peer=peer.did,
            cid=str(cid),
            num_samples=num_samples,
            sent_at=int(time.time() * 1000),
        )
        await node.publish(coordinator.config.gradients_topic, encode_message(ann, peer))
        for _ in range(50):
            if coordinator.round > round_:
                return
            book = coordinator._books.get(round_)
            if book is not None and book.slots[peer.did].state is not PeerState.PENDING:
                return
            await asyncio.sleep(0.01)


async def _publish(w: World, i: int, gradient: Gradient, round_: int, n: int = 1) -> CID:
    """Peer ``i`` publishes as ``gradstore peer publish`` does (its document names it)."""
    async with Peer(w.config, w.peer_nodes[i], w.peer_keys[i], first_backoff_s=0.3) as peer:
        return await peer.publish(gradient, round_, n, timeout=30)


async def _record_exclusions(w: World, record: CID | None) -> dict[str, tuple[str, CID | None]]:
    assert record is not None
    decoded = decode_record(await w.coord_node.get_block(record), cid=record)
    return {e.peer: (e.reason, e.cid) for e in decoded.excluded}


def test_a_peer_announcing_another_peers_cid_is_excluded_as_wrong_peer(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Defect: B announced A's CID (seen on the topic) and was aggregated with A's update,
    # counted twice in the mean with no work of its own.
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(2, method="mean", quorum=1)
    a, b = 0, 1

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            coordinator, task = _coordinator(w, tmp_path)
            await wait_subscribed(w)
            await _running(coordinator)
            taken = await _publish(w, a, gradients(1, 0)[0], 0)
            await _announce(coordinator, w.peer_nodes[b], peers[b], taken)
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "closed", outcome.reason
            assert outcome.peers == (peers[a].did,)
            reason = dict(outcome.excluded)[peers[b].did]
            assert reason.startswith(f"wrong-peer: the document names peer '{peers[a].did}'")
            exclusions = await _record_exclusions(w, outcome.record)
            assert exclusions == {peers[b].did: (reason, taken)}
            assert taken in await w.coord_node.pins()  # A's input stays pinned

    asyncio.run(go())


def test_a_peer_announcing_its_previous_rounds_cid_is_excluded_as_wrong_round(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Defect: B re-announced its round-0 document in round 1 and was aggregated again.
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(2, method="mean", rounds=2, quorum=1)
    a, b = 0, 1

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            coordinator, task = _coordinator(w, tmp_path)
            await wait_subscribed(w)
            await _running(coordinator)
            grads = gradients(2, 0)
            _, old = await asyncio.gather(_publish(w, a, grads[a], 0), _publish(w, b, grads[b], 0))
            await _running(coordinator, 1)
            await _publish(w, a, gradients(1, 1)[0], 1)
            await _announce(coordinator, w.peer_nodes[b], peers[b], old, round_=1)
            first, second = await asyncio.wait_for(task, 60)
            assert first.status == second.status == "closed"
            assert set(first.peers) == {peers[a].did, peers[b].did}
            assert second.peers == (peers[a].did,)
            reason = dict(second.excluded)[peers[b].did]
            assert reason == "wrong-round: the document names round 0, announced for round 1"
            assert (await _record_exclusions(w, second.record))[peers[b].did] == (reason, old)
            assert old in await w.coord_node.pins()  # still round 0's aggregated input

    asyncio.run(go())


def test_a_document_replayed_into_a_new_run_of_the_job_is_excluded_as_wrong_run(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Defect: a peer's documents named no run, so a copy from an earlier run of the same job
    # (same round number) passed as this run's work.
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(2, method="mean", rounds=1, quorum=1)
    a, b = 0, 1

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            first, task = _coordinator(w, tmp_path / "first")
            await wait_subscribed(w)
            await _running(first)
            old = await _publish(w, b, gradients(1, 0)[0], 0)
            doc = await GradientStore(w.coord_node).get(old)
            assert doc.meta["run"] == first.run_id
            await _publish(w, a, gradients(1, 1)[0], 0)
            await asyncio.wait_for(task, 60)
            second, task = _coordinator(w, tmp_path / "second")
            await _running(second)
            assert second.run_id != first.run_id
            await _publish(w, a, gradients(1, 2)[0], 0)
            await _announce(second, w.peer_nodes[b], peers[b], old)
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.peers == (peers[a].did,)
            reason = dict(outcome.excluded)[peers[b].did]
            assert reason.startswith("wrong-run: the document names run")

    asyncio.run(go())


def test_the_second_announcement_of_one_cid_without_meta_is_excluded_as_duplicate(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Defect: two peers announced one document that names nobody; both were aggregated (the
    # second for free), and forgetting the round unpinned the aggregated input's CID.
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(3, method="mean", quorum=2)

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            coordinator, task = _coordinator(w, tmp_path)
            await wait_subscribed(w)
            await _running(coordinator)
            bare = await GradientStore(w.peer_nodes[0]).put(gradients(1, 0)[0])  # no meta
            await _announce(coordinator, w.peer_nodes[0], peers[0], bare)
            await _announce(coordinator, w.peer_nodes[1], peers[1], bare)
            await _publish(w, 2, gradients(1, 5)[0], 0)
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "closed", outcome.reason
            assert set(outcome.peers) == {peers[0].did, peers[2].did}
            reason = dict(outcome.excluded)[peers[1].did]
            assert reason == f"duplicate-cid: {bare} was announced first by {peers[0].did}"
            assert (await _record_exclusions(w, outcome.record))[peers[1].did] == (reason, bare)
            assert bare in await w.coord_node.pins()  # the first announcer's input keeps its pin

    asyncio.run(go())


def test_a_job_requiring_bound_meta_refuses_a_document_without_it(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    loose, coord, peers = make_job(2, method="mean", quorum=1)
    config: JobConfig = dataclasses.replace(loose, inputs=InputsConfig(require_bound_meta=True))

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            coordinator, task = _coordinator(w, tmp_path)
            await wait_subscribed(w)
            await _running(coordinator)
            await _publish(w, 0, gradients(1, 0)[0], 0)  # Peer.publish binds its document
            bare = await GradientStore(w.peer_nodes[1]).put(gradients(1, 3)[0])
            await _announce(coordinator, w.peer_nodes[1], peers[1], bare)
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "closed", outcome.reason
            assert outcome.peers == (peers[0].did,)
            reason = dict(outcome.excluded)[peers[1].did]
            assert reason.startswith("unbound: the job requires documents whose meta names")
            assert reason.endswith("lacks peer, round, job")

    asyncio.run(go())
