"""How long a peer waits once the coordinator has told it what it needs to know (issue 23, R3),
and how a peer whose announcement was lost gets its input into the round by announcing again.

The coordinator repeats its statuses and its last result or failure every ``rebroadcast_s``
(0.5 s here). Those repeats wake a waiting peer; they must not restart what it waits for.
Real Kubo daemons; the only fake drops a peer's announcements (lost pubsub messages).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from gradstore.coordinator import Coordinator, RoundOutcome
from gradstore.errors import Reason, RefusedError
from gradstore.messages import decode_record
from gradstore.node import KuboNode
from gradstore.peer import Peer
from gradstore.peer._client import _OVER_GRACE_S
from gradstore.store import GradientStore

from ..coordinator.harness import gradients, make_job, start_coordinator, wait_subscribed, world

pytestmark = pytest.mark.kubo

#: The peer's own timeout: long, so waiting it out shows.
TIMEOUT_S = 30.0


class _DropPublishes(httpx.AsyncBaseTransport):
    """In front of a peer's real Kubo: the first ``n`` pubsub/pub calls answer 200, never sent."""

    def __init__(self, n: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.n = n
        self.dropped = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/pubsub/pub") and self.dropped < self.n:
            self.dropped += 1
            async for _ in request.stream:  # type: ignore[union-attr]
                pass
            return httpx.Response(200, content=b"")
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.parametrize(
    ("quorum", "told", "code", "within_s"),
    [
        # the round failed: nothing more will come, the peer raises as soon as it hears
        (
            2,
            "round 0 failed: quorum not met: 1 verified of 2 needed",
            Reason.ROUND_FAILED,
            3.0,
        ),
        # the round closed without it: it waits its grace for a word, then raises
        (
            1,
            "round 0 closed without this peer's input",
            Reason.ROUND_OVER,
            _OVER_GRACE_S + 2.0,
        ),
    ],
)
def test_a_peer_left_out_of_a_round_raises_within_its_grace_not_its_timeout(  # type: ignore[no-untyped-def]
    kubo_factory, tmp_path: Path, quorum: int, told: str, code: Reason, within_s: float
) -> None:
    daemons = kubo_factory(3, connect=True)
    # two rounds: the coordinator goes on repeating itself while the peer waits
    config, coord, peers = make_job(2, method="sum", quorum=quorum, deadline_s=2, rounds=2)
    grads = gradients(2, 0)
    lost = _DropPublishes(1 << 30)  # peer 0's announcements never reach the coordinator
    ended: dict[int, float] = {}

    def on_round(outcome: RoundOutcome) -> None:
        ended[outcome.round] = time.monotonic()

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            coordinator = Coordinator(
                config,
                coord,
                w.coord_node,
                tmp_path,
                rebroadcast_s=0.5,
                linger_s=0,
                on_round=on_round,
            )
            stop = asyncio.Event()
            task = asyncio.create_task(coordinator.run(stop))
            await wait_subscribed(w)
            lossy = KuboNode(daemons[1].api_url, transport=lost)
            try:
                async with (
                    Peer(config, lossy, peers[0], first_backoff_s=0.5) as p0,
                    Peer(config, w.peer_nodes[1], peers[1], first_backoff_s=0.5) as p1,
                ):
                    await p1.publish(grads[1], 0, 1, timeout=TIMEOUT_S)
                    started = time.monotonic()
                    with pytest.raises(RefusedError) as info:
                        await p0.publish(grads[0], 0, 1, timeout=TIMEOUT_S)
                    raised = time.monotonic()
            finally:
                await lossy.aclose()
                stop.set()
                await asyncio.wait_for(task, 30)
            assert lost.dropped >= 1
            assert told in str(info.value) and info.value.reason == told
            assert (info.value.code, info.value.round, info.value.peer) == (code, 0, peers[0].did)
            heard = raised - ended[0]
            print(f"peer 0 raised {heard:.2f} s after round 0 ended ({raised - started:.2f} s)")
            assert heard < within_s, f"raised {heard:.1f} s after the round ended"

    asyncio.run(go())


def test_a_lost_announcement_is_sent_again_after_its_backoff_while_statuses_arrive(  # type: ignore[no-untyped-def]
    kubo_factory, tmp_path: Path
) -> None:
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(2, method="sum", deadline_s=60)
    grads = gradients(2, 0)
    lost = _DropPublishes(1)  # peer 0's first announcement is lost
    backoff_s = 2.0  # longer than the coordinator's 0.5 s repeats

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            coordinator = Coordinator(
                config, coord, w.coord_node, tmp_path, rebroadcast_s=0.5, linger_s=0
            )
            task = asyncio.create_task(coordinator.run())
            await wait_subscribed(w)
            lossy = KuboNode(daemons[1].api_url, transport=lost)
            try:
                async with (
                    Peer(config, lossy, peers[0], first_backoff_s=backoff_s) as p0,
                    Peer(config, w.peer_nodes[1], peers[1], first_backoff_s=0.5) as p1,
                ):
                    await p1.publish(grads[1], 0, 1, wait=False)
                    started = time.monotonic()
                    await p0.publish(grads[0], 0, 1, timeout=TIMEOUT_S)
                    took = time.monotonic() - started
            finally:
                await lossy.aclose()
            (outcome,) = await asyncio.wait_for(task, 30)
            assert outcome.status == "closed" and len(outcome.peers) == 2
            assert lost.dropped == 1 and p0.announcements_sent == 2
            print(f"peer 0 verified {took:.2f} s after it first announced")
            assert took < backoff_s + 4.0

    asyncio.run(go())


def test_lost_announcement_gets_in_by_reannouncing(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(2, method="sum")
    grads = gradients(2, 0)
    dropper = _DropPublishes(1)  # peer 0's first announcement is lost

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            _, task = start_coordinator(w, tmp_path)
            await wait_subscribed(w)
            lossy = KuboNode(daemons[1].api_url, transport=dropper)
            try:
                async with (
                    Peer(config, lossy, peers[0], first_backoff_s=0.5) as p0,
                    Peer(config, w.peer_nodes[1], peers[1], first_backoff_s=0.5) as p1,
                ):
                    await asyncio.gather(
                        p0.publish(grads[0], 0, 1, timeout=20),
                        p1.publish(grads[1], 0, 1, timeout=20),
                    )
                    assert dropper.dropped == 1 and p0.announcements_sent >= 2
            finally:
                await lossy.aclose()
            (outcome,) = await asyncio.wait_for(task, 30)
            record = decode_record(await w.coord_node.get_block(outcome.record), cid=outcome.record)
            assert sorted(i.peer for i in record.inputs) == sorted(
                p.did for p in peers
            )  # each once
            result = await GradientStore(w.coord_node).get(outcome.output)
            np.testing.assert_allclose(
                result.tensors["w"],
                grads[0].tensors["w"].astype(np.float64) + grads[1].tensors["w"],
                rtol=1e-6,
            )

    asyncio.run(go())
