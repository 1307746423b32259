"""follow(): a service keeps hearing a topic after its subscription fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import gradstore.node._follow as follow_module
from gradstore.errors import NodeError
from gradstore.node import LocalNode, follow


def test_follow_resubscribes_after_the_subscription_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follow_module, "FIRST_DELAY_S", 0.01)

    async def go() -> None:
        node = LocalNode(tmp_path)
        sub = node.subscribe("t")
        await sub.__aenter__()
        stream = follow(node, sub)
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
