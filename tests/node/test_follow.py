"""follow(): a service keeps hearing a topic after its subscription fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gradstore.errors import NodeError
from gradstore.node import LocalNode, LocalSubscription, Retry, follow
from gradstore.node._follow import RESUBSCRIBE

FAST = Retry(retries=None, backoff=0.01)


def test_follow_resubscribes_after_the_subscription_fails(tmp_path: Path) -> None:
    async def go() -> None:
        node = LocalNode(tmp_path)
        sub = node.subscribe("t")
        await sub.__aenter__()
        stream = follow(node, sub, retry=FAST)
        await node.publish("t", b"one")
        assert (await anext(stream)).data == b"one"
        sub._queue.put_nowait(NodeError("kubo pubsub/sub 't': the node ended the stream"))  # type: ignore[attr-defined]
        got = asyncio.create_task(anext(stream))
        for _ in range(100):  # until the replacement subscription is live
            await asyncio.sleep(0.01)
            if len(node._hub.subscribers.get("t", ())) == 1 and sub._closed:  # type: ignore[attr-defined]
                break
        await node.publish("t", b"two")
        assert (await asyncio.wait_for(got, 5)).data == b"two"
        await stream.aclose()
        assert not node._hub.subscribers.get("t")  # the replacement is closed too

    asyncio.run(go())


class _Unsubscribable(LocalNode):
    """A LocalNode whose subscriptions fail to open once ``refuse`` is set (a node gone away)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.refuse = False
        self.refused = 0

    def subscribe(self, topic: str) -> LocalSubscription:
        sub = super().subscribe(topic)
        if self.refuse:

            async def refuse() -> None:
                self.refused += 1
                raise NodeError("cannot connect")

            sub._activate = refuse  # type: ignore[method-assign]
        return sub


def test_follow_gives_up_once_a_limited_retry_runs_out(tmp_path: Path) -> None:
    async def go() -> None:
        node = _Unsubscribable(tmp_path)
        sub = node.subscribe("t")
        await sub.__aenter__()
        node.refuse = True
        sub._queue.put_nowait(NodeError("the node ended the stream"))  # type: ignore[attr-defined]
        with pytest.raises(NodeError, match="gave up"):
            await anext(follow(node, sub, retry=Retry(retries=3, backoff=0.001)))
        assert node.refused == 3

    asyncio.run(go())


def test_services_resubscribe_for_ever_with_capped_backoff() -> None:
    delays = RESUBSCRIBE.delays()
    first = [next(delays) for _ in range(50)]
    assert first[:3] == [0.5, 1.0, 2.0]
    assert max(first) == first[-1] == 10.0
