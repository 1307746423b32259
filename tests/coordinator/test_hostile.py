"""Hostile peers against a coordinator on real Kubo daemons: each test is one attack that
used to cost a round (or the coordinator's time), and the defence that now holds.

Fakes only sit in front of a real Kubo (a transport that counts requests, or drops them
for a while); everything else is real: daemons, bitswap, pubsub, pins.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gradstore.coordinator import Coordinator
from gradstore.dag import CID, build_file
from gradstore.dag.cid import RAW
from gradstore.errors import Reason, RefusedError
from gradstore.format import Gradient, encode
from gradstore.job import parse_job
from gradstore.messages import Announce, SigningKey, Status, decode_record, encode_message
from gradstore.node import KuboNode
from gradstore.peer import Peer
from gradstore.store import GradientStore

from .harness import (
    World,
    gradients,
    key,
    make_job,
    publish_all,
    wait_subscribed,
    world,
)

pytestmark = pytest.mark.kubo


def _coordinator(w: World, state: Path, **kwargs: Any) -> tuple[Coordinator, asyncio.Task[Any]]:
    options: dict[str, Any] = {"rebroadcast_s": 0.5, "linger_s": 0, "resolve_timeout_s": 1.5}
    options.update(kwargs)
    node = options.pop("node", w.coord_node)
    coordinator = Coordinator(w.config, w.coord_key, node, state, **options)
    return coordinator, asyncio.create_task(coordinator.run())


async def _running(coordinator: Coordinator) -> None:
    while not coordinator.run_id:
        await asyncio.sleep(0.01)


def _announce(coordinator: Coordinator, peer: SigningKey, cid: CID | str, round_: int = 0) -> bytes:
    ann = Announce(
        job=coordinator.config.job,
        run=coordinator.run_id,
        round=round_,
        peer=peer.did,
        cid=str(cid),
        num_samples=1,
        sent_at=int(time.time() * 1000),
    )
    return encode_message(ann, peer)


def _ghost() -> CID:
    """A CID nobody on the network serves."""
    return CID.hash(RAW, os.urandom(32))


def _doc_blocks(gradient: Gradient, job: str, peer: str, round_: int = 0) -> list[Any]:
    """The blocks of the document ``Peer.publish`` stores for ``gradient``."""
    meta = {"kind": "gradient", "round": round_, "peer": peer, "num_samples": 1, "job": job}
    return list(build_file(encode(Gradient(gradient.tensors, meta))))


def test_an_input_nobody_serves_does_not_wedge_the_round(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Defect: the record linked the unfetchable CID and was pinned recursively, so Kubo waited
    # for it until the read timeout, which escaped run(): no result, CLI exit 1.
    daemons = kubo_factory(4, connect=True)
    config, coord, peers = make_job(4, method="mean", quorum=2, deadline_s=8)
    grads = gradients(4, 0)

    async def go() -> None:
        async with world(daemons[:3], config, coord, peers) as w:
            coordinator, task = _coordinator(w, tmp_path, fetch_attempts=2)
            await wait_subscribed(w)
            await _running(coordinator)
            ghost = _ghost()
            await w.peer_nodes[2].publish(
                config.gradients_topic, _announce(coordinator, peers[2], ghost)
            )
            # peer 3's node goes offline right after it stored its gradient
            offline = daemons[3].node()
            gone = await GradientStore(offline).put(grads[3])
            await offline.aclose()
            daemons[3].stop()
            await w.peer_nodes[3].publish(
                config.gradients_topic, _announce(coordinator, peers[3], gone)
            )
            await publish_all(w, 0, [grads[0], grads[1], None, None], [1] * 4)
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "closed"
            assert set(outcome.peers) == {peers[0].did, peers[1].did}
            excluded = dict(outcome.excluded)
            assert excluded[peers[2].did].startswith("unavailable: ")
            assert excluded[peers[3].did].startswith("unavailable: ")
            record = decode_record(await w.coord_node.get_block(outcome.record), cid=outcome.record)
            assert {e.peer: e.cid for e in record.excluded} == {
                peers[2].did: ghost,
                peers[3].did: gone,
            }
            pins = await w.coord_node.pins()
            assert outcome.output in pins and ghost not in pins and gone not in pins
            assert not await w.coord_node.has_block(ghost)

    asyncio.run(go())


def test_a_restart_after_the_deadline_closes_with_the_journaled_inputs(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Defect: the restarted coordinator took the deadline from the journal's opening time and
    # failed the round ("quorum not met: 0 verified") with the inputs sitting in the journal.
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(3, method="mean", quorum=2, deadline_s=2)
    grads = gradients(3, 0)

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            first, task = _coordinator(w, tmp_path)
            await wait_subscribed(w)
            await _running(first)
            for i in (0, 1):
                cid = await GradientStore(w.peer_nodes[i]).put(grads[i])
                await w.peer_nodes[i].publish(
                    config.gradients_topic, _announce(first, peers[i], cid)
                )
            while first.journal.pending or len(first.journal.inputs(0)) < 2:
                await asyncio.sleep(0.01)
            task.cancel()  # the coordinator goes down with the round open
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(3)  # down while the deadline passes
            second, again = _coordinator(w, tmp_path)
            (outcome,) = await asyncio.wait_for(again, 30)
            assert outcome.status == "closed", outcome.reason
            assert set(outcome.peers) == {peers[0].did, peers[1].did}
            assert second.run_id == first.run_id
            result = await GradientStore(w.coord_node).get(outcome.output)
            expected = (grads[0].tensors["w"].astype(np.float64) + grads[1].tensors["w"]) / 2
            np.testing.assert_array_equal(result.tensors["w"], expected.astype(np.float32))

    asyncio.run(go())


def test_an_input_over_the_size_limit_is_refused_before_its_leaves_are_fetched(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Defect: the refused input was downloaded in full to the coordinator's node, leaves pinned.
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(3, method="mean", quorum=2, deadline_s=20)
    raw = {
        "job": config.job,
        "coordinator": config.coordinator,
        "peers": list(config.peers),
        "aggregation": {"method": "mean"},
        "rounds": {"count": 1, "quorum": 2, "deadline_s": 20},
        "limits": {"max_gradient_bytes": 1 << 20},
    }
    config = parse_job(raw)
    grads = gradients(3, 0)
    rng = np.random.default_rng(5)
    big = Gradient(
        {"b": rng.standard_normal(7), "w": rng.standard_normal((3 << 18,)).astype(np.float32)}
    )  # 3 MiB: three leaves past the limit

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            _, task = _coordinator(w, tmp_path)
            await wait_subscribed(w)
            async with Peer(config, w.peer_nodes[2], peers[2]) as liar:
                honest = publish_all(w, 0, [grads[0], grads[1], None], [1] * 3)
                with pytest.raises(RefusedError, match="too-large") as info:
                    await asyncio.gather(liar.publish(big, 0, 1, timeout=30), honest)
            assert "over the 1048576-byte limit" in info.value.reason
            (outcome,) = await asyncio.wait_for(task, 30)
            assert outcome.status == "closed" and peers[2].did not in outcome.peers
            blocks = _doc_blocks(big, config.job, peers[2].did)
            root, leaves = blocks[-1], [b for b in blocks if b.cid.codec == RAW]
            assert len(leaves) == 4
            for leaf in leaves:  # nothing past the root was fetched
                assert not await w.coord_node.has_block(leaf.cid)
            assert root.cid not in await w.coord_node.pins()

    asyncio.run(go())


def test_peers_announcing_cids_nobody_serves_cannot_starve_honest_inputs(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Defect: a fetch kept its slot while retrying until the deadline, so as many ghost CIDs
    # as there were slots kept every honest input from being verified.
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(9, method="median", quorum=3, deadline_s=25)
    grads = gradients(9, 0)

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            coordinator, task = _coordinator(
                w, tmp_path, fetch_concurrency=4, fetch_attempts=3, resolve_timeout_s=2.0
            )
            await wait_subscribed(w)
            await _running(coordinator)
            started = time.monotonic()
            for i in range(6):  # six ghosts, more than the four fetch workers
                await w.peer_nodes[i].publish(
                    config.gradients_topic, _announce(coordinator, peers[i], _ghost())
                )
            await asyncio.sleep(0.3)  # the ghosts are first in line
            await publish_all(w, 0, [None] * 6 + list(grads[6:]), [1] * 9)
            honest_verified = time.monotonic() - started
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "closed", outcome.reason
            assert set(outcome.peers) == {p.did for p in peers[6:]}
            assert honest_verified < 10  # within a couple of ghost timeouts, not the deadline
            assert all(
                why.startswith("unavailable: ") and "3 attempts" in why
                for peer, why in outcome.excluded
            )
            assert outcome.stats["open_s"] < 25  # every ghost spent its budget: closed early

    asyncio.run(go())


class _CountPublishes(httpx.AsyncBaseTransport):
    """In front of the coordinator's real Kubo: counts pubsub/pub requests."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.publishes = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/pubsub/pub"):
            self.publishes += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_replays_cost_no_publish_and_the_reader_keeps_up(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Defect: each replay made the coordinator publish a status, and its reader waited for
    # that publish, so at ~300 replays per second it fell further and further behind.
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(2, method="mean", quorum=2, deadline_s=60)
    counter = _CountPublishes()

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            node = KuboNode(daemons[0].api_url, transport=counter)
            coordinator, task = _coordinator(w, tmp_path, node=node, rebroadcast_s=30)
            await wait_subscribed(w)
            await _running(coordinator)
            cid = await GradientStore(w.peer_nodes[0]).put(gradients(1, 0)[0])
            first = _announce(coordinator, peers[0], cid)
            await w.peer_nodes[0].publish(config.gradients_topic, first)
            while coordinator.journal.inputs(0) == []:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            flood = daemons[0].node()  # an attacker on the coordinator's own node
            seen = 0
            async with flood.subscribe(config.gradients_topic) as spy:

                async def count() -> None:
                    nonlocal seen
                    async for _ in spy:
                        seen += 1

                counting = asyncio.create_task(count())
                before = counter.publishes
                started = time.monotonic()
                for _ in range(600):  # exact replays, as fast as the node takes them
                    await flood.publish(config.gradients_topic, first)
                for _ in range(30):  # and re-signed duplicates (the peer's re-announcements)
                    await flood.publish(
                        config.gradients_topic, _announce(coordinator, peers[0], cid)
                    )
                sent_s = time.monotonic() - started
                await asyncio.sleep(1.0)
                counting.cancel()
            await flood.aclose()
            assert seen >= 600
            handled = coordinator.refusals["duplicate"]
            assert handled == seen  # every one handled, as a duplicate
            assert time.monotonic() - started < sent_s + 2.0  # and the reader kept up
            assert counter.publishes - before <= 2  # no publish per duplicate
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await node.aclose()

    asyncio.run(go())


def test_refusals_are_counted_and_only_the_recent_ones_kept(tmp_path: Path) -> None:
    # Defect: every refusal was kept (about 250 bytes each) for the life of the coordinator.
    from gradstore.node import LocalNode

    config, coord, _ = make_job(2)
    coordinator = Coordinator(config, coord, LocalNode(tmp_path / "n"), tmp_path / "s")
    outsider = key(77)
    for i in range(5_000):
        ann = Announce(config.job, "a" * 26, 0, outsider.did, str(_ghost()), i, 1)
        coordinator.on_message(encode_message(ann, outsider))
    coordinator.on_message(b"\xc1" * 10)
    assert coordinator.refusals == {"unknown-peer": 5_000, "malformed": 1}
    assert len(coordinator.recent_refusals) == 256
    assert coordinator.recent_refusals[-1][0] == "malformed"


def test_an_earlier_runs_messages_are_not_trusted(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Defect: replayed status and result messages of an earlier run made a new run's peer
    # report "acknowledged" and made await_result(0) return the old run's aggregate.
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(2, method="mean", quorum=2, deadline_s=30)
    old_grads, new_grads = gradients(2, 0), gradients(2, 7)
    captured: list[bytes] = []

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            spy = w.peer_nodes[1]
            async with spy.subscribe(config.results_topic) as sub:

                async def capture() -> None:
                    async for msg in sub:
                        captured.append(msg.data)

                capturing = asyncio.create_task(capture())
                earlier, first = _coordinator(w, tmp_path / "run-1")
                await wait_subscribed(w)
                await publish_all(w, 0, old_grads, [1, 1])
                (old,) = await asyncio.wait_for(first, 30)
                await asyncio.sleep(0.3)
                capturing.cancel()
            assert captured

            async def replay() -> None:
                while True:
                    for data in captured:
                        await spy.publish(config.results_topic, data)
                    await asyncio.sleep(0.05)

            replaying = asyncio.create_task(replay())
            try:
                async with Peer(config, w.peer_nodes[0]) as listener:
                    # the peers start while only the earlier run's messages fly: they must not
                    # take its statuses as acknowledgements, nor its result as this round's
                    publishing = asyncio.create_task(publish_all(w, 0, new_grads, [1, 1]))
                    awaiting = asyncio.create_task(listener.await_result(0, timeout=60))
                    await asyncio.sleep(2.0)
                    assert not publishing.done() and not awaiting.done()
                    second, task = _coordinator(w, tmp_path / "run-2", rebroadcast_s=1.0)
                    await publishing
                    result = await awaiting
                (new,) = await asyncio.wait_for(task, 30)
            finally:
                replaying.cancel()
            assert new.output != old.output
            assert result.cid == new.output and result.record == new.record
            assert second.run_id != earlier.run_id

    asyncio.run(go())


def test_a_refusal_with_a_code_the_peer_does_not_know_is_read_as_unknown(kubo_factory) -> None:  # type: ignore[no-untyped-def]
    # A newer or hostile coordinator signs a status refusing the peer with a code this
    # version has no name for: the peer raises a typed RefusedError (code UNKNOWN, the text
    # kept) instead of crashing or waiting out its timeout.
    daemons = kubo_factory(2, connect=True)
    config, coord, peers = make_job(1, method="sum", quorum=1, deadline_s=30)
    told = "evil-code: the coordinator says so"

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            me, nobody = config.roster.bitmap([peers[0].did]), config.roster.bitmap(())

            async def hostile_statuses() -> None:
                while True:
                    status = Status(
                        config.job, "h" * 26, 0, me, nobody, me, (told,), int(time.time() * 1000)
                    )
                    await w.coord_node.publish(config.results_topic, encode_message(status, coord))
                    await asyncio.sleep(0.2)

            statuses = asyncio.create_task(hostile_statuses())
            try:
                async with Peer(config, w.peer_nodes[0], peers[0], first_backoff_s=0.3) as peer:
                    with pytest.raises(RefusedError) as info:
                        await peer.publish(gradients(1, 0)[0], 0, 1, timeout=20)
            finally:
                statuses.cancel()
            assert info.value.code is Reason.UNKNOWN and info.value.reason == told
            assert info.value.detail == "the coordinator says so"
            assert (info.value.round, info.value.job, info.value.peer) == (
                0,
                config.job,
                peers[0].did,
            )

    asyncio.run(go())


class _Outage(httpx.AsyncBaseTransport):
    """In front of the coordinator's real Kubo: from the first request that stores the
    aggregate, every new request fails to connect for ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seconds = seconds
        self.until: float | None = None
        self.refused = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        command = request.url.path.rsplit("/api/v0/", 1)[-1]
        if self.until is None and command in ("dag/import", "block/put", "add", "dag/put"):
            self.until = time.monotonic() + self.seconds
        if self.until is not None and time.monotonic() < self.until:
            self.refused += 1
            raise httpx.ConnectError("connection refused (the test's outage)", request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_kubo_dropping_while_the_aggregate_is_stored_does_not_lose_the_round(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Defect: storing the aggregate and the record was not retried; a Kubo that dropped for
    # a moment killed the coordinator and the round was lost.
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(2, method="mean", quorum=2, deadline_s=30)
    grads = gradients(2, 0)
    outage = _Outage(4.0)

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            node = KuboNode(daemons[0].api_url, transport=outage)
            _, task = _coordinator(w, tmp_path, node=node)
            await wait_subscribed(w)
            await publish_all(w, 0, grads, [1, 1])
            (outcome,) = await asyncio.wait_for(task, 60)
            await node.aclose()
            assert outage.refused > 0 and outcome.status == "closed"
            record = decode_record(await w.coord_node.get_block(outcome.record), cid=outcome.record)
            assert record.output == outcome.output
            assert outcome.output in await w.coord_node.pins()

    asyncio.run(go())
