"""When a peer with several announcements out announces again (issue 19): not while the
coordinator is still acknowledging its other announcements one after the other, and still
once those acknowledgements stop and one of its announcements has had no word.

A 64-step round's coordinator took over a second to acknowledge 256 announcements made at
once, and peers announced each again after 1 s: 2.7 announcements per input, each one more
message for the coordinator to verify. Against a scripted coordinator on real Kubo pubsub.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from gradstore.job import JobConfig
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon
from gradstore.peer import Peer

from .scripted import ScriptedCoordinator, stepped_job
from .test_steps import whole_gradient

pytestmark = pytest.mark.kubo

#: The peer's first wait for a word before it announces again.
BACKOFF_S = 1.2
#: The scripted coordinator acknowledges one step's announcement this long after the last.
ACK_EVERY_S = 0.6


@contextlib.asynccontextmanager
async def staged(
    daemons: Sequence[KuboDaemon], config: JobConfig, coord: SigningKey, key: SigningKey
) -> AsyncIterator[tuple[ScriptedCoordinator, Peer]]:
    """The scripted coordinator on daemon 0, peer 0 (in every step) on daemon 1."""
    coord_node, peer_node = daemons[0].node(), daemons[1].node()
    try:
        async with (
            ScriptedCoordinator(config, coord, coord_node).running() as c,
            Peer(config, peer_node, key, first_backoff_s=BACKOFF_S) as peer,
        ):
            await peer_node.wait_for_topic_peers(config.gradients_topic, 1, timeout=15)
            await coord_node.wait_for_topic_peers(config.results_topic, 1, timeout=15)
            for step in config.steps:
                await c.status(0, step.name)
            yield c, peer
    finally:
        await coord_node.aclose()
        await peer_node.aclose()


def test_steps_acknowledged_one_after_another_are_announced_once_each(kubo_factory) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    did = keys[0].did  # in all three steps

    async def go() -> None:
        async with staged(daemons, config, coord, keys[0]) as (c, peer):
            publishing = asyncio.create_task(peer.publish_steps(whole_gradient(), 0, 3, timeout=30))
            for step in ("head", "body", "embed"):
                await c.announcement(lambda a, step=step: a.step == step)
            started = time.monotonic()
            # one step acknowledged every 0.6 s: the last 1.8 s after the announcements, past
            # the peer's 1.2 s backoff, but never 1.2 s after the one before
            for step in ("head", "body", "embed"):
                await asyncio.sleep(ACK_EVERY_S)
                await c.status(0, step, received=[did])
            took = time.monotonic() - started
            for step in ("head", "body", "embed"):
                await c.status(0, step, verified=[did])
            await asyncio.wait_for(publishing, 20)
            sent = [h.msg.step for h in c.heard if h.msg.peer == did]
            print(f"acknowledged over {took:.2f} s; announcements {sent}")
            assert took > BACKOFF_S
            assert sorted(sent) == ["body", "embed", "head"], sent
            assert peer.announcements_sent == 3

    asyncio.run(go())


def test_an_announcement_with_no_word_once_the_acknowledgements_stop_goes_again(  # type: ignore[no-untyped-def]
    kubo_factory,
) -> None:
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    did = keys[0].did

    async def go() -> None:
        async with staged(daemons, config, coord, keys[0]) as (c, peer):
            publishing = asyncio.create_task(peer.publish_steps(whole_gradient(), 0, 3, timeout=30))
            for step in ("head", "body", "embed"):
                await c.announcement(lambda a, step=step: a.step == step)
            # embed's announcement is "lost": the others are acknowledged, it never is
            for step in ("head", "body"):
                await asyncio.sleep(ACK_EVERY_S)
                await c.status(0, step, verified=[did])
            last_ack = time.monotonic()
            again = [h for h in c.heard if h.msg.step == "embed"]
            assert len(again) == 1
            await c.announcement(lambda a: a.step == "embed" and len(_embeds(c)) >= 2, 15)
            waited = time.monotonic() - last_ack
            print(f"embed announced again {waited:.2f} s after the last acknowledgement")
            assert waited < BACKOFF_S + 3.0
            await c.status(0, "embed", verified=[did])
            await asyncio.wait_for(publishing, 20)

    asyncio.run(go())


def _embeds(c: ScriptedCoordinator) -> list[object]:
    return [h for h in c.heard if h.msg.step == "embed"]


def test_a_peer_waits_twice_as_long_as_its_acknowledgements_took_before_announcing_again(  # type: ignore[no-untyped-def]
    kubo_factory,
) -> None:
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    did = keys[0].did
    slow_s = 1.6  # the coordinator acknowledges this long after it heard: past the 1.2 s backoff

    async def go() -> None:
        async with staged(daemons, config, coord, keys[0]) as (c, peer):
            for step in ("head", "embed"):  # one after the other
                publishing = asyncio.create_task(
                    peer.publish(whole_gradient(), 0, 3, step=step, timeout=30)
                )
                await c.announcement(lambda a, step=step: a.step == step)
                await asyncio.sleep(slow_s)
                await c.status(0, step, verified=[did])
                await asyncio.wait_for(publishing, 20)
            sent = [h.msg.step for h in c.heard if h.msg.peer == did]
            print(f"announcements {sent}")
            # head: no acknowledgement timed yet, so sent again after 1.2 s; embed: the peer
            # learned that acknowledgements take about 1.6 s, and waits 3.2 s
            assert sent.count("head") == 2, sent
            assert sent.count("embed") == 1, sent

    asyncio.run(go())
