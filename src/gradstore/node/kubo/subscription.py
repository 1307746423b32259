"""``KuboSubscription``: a ``pubsub/sub`` stream drained into a queue by a background task.

It needs one thing of the node: ``KuboClient.stream``, a long-lived answer on a client of its
own. The node learns which subscriptions are live through the ``live`` set it hands in, and
closes them when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import MutableSet

from ...errors import NodeError
from .._subscription import QueuedSubscription
from . import rpc
from .client import KuboClient


class KuboSubscription(QueuedSubscription):
    """A ``pubsub/sub`` stream read by a background task into an unbounded queue.

    Kubo buffers only 32 messages per subscriber and drops the rest, so the
    reader drains the stream as soon as lines arrive, on its own client with no
    read timeout. ``async with`` returns once Kubo has answered the request,
    which it does only after it has subscribed. While active it is in ``live``.
    """

    def __init__(
        self,
        client: KuboClient,
        topic: str,
        *,
        live: MutableSet[KuboSubscription] | None = None,
    ) -> None:
        super().__init__(topic)
        self.client = client
        self._live = live if live is not None else set()
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"KuboSubscription({self.client.api!r}, {self.topic!r})"

    async def _activate(self) -> None:
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(
                self._read(self._ready), name=f"pubsub-sub {self.topic}"
            )
            self._live.add(self)
        await asyncio.shield(self._ready)

    async def _read(self, ready: asyncio.Future[None]) -> None:
        try:
            async with self.client.stream(
                "pubsub/sub", rpc.pubsub_sub_params(self.topic)
            ) as response:
                ready.set_result(None)
                async for line in response.aiter_lines():
                    if line.strip():
                        item = rpc.parse_json("pubsub/sub", line.encode("utf-8"))
                        self._queue.put_nowait(rpc.parse_pubsub_message(item, self.topic))
            self._queue.put_nowait(
                NodeError(f"kubo pubsub/sub {self.topic!r}: the node ended the stream")
            )
        except Exception as exc:
            error = (
                exc
                if isinstance(exc, NodeError)
                else NodeError(f"kubo pubsub/sub {self.topic!r}: {exc!r}")
            )
            if not ready.done():
                ready.set_exception(error)
            self._queue.put_nowait(error)

    async def _deactivate(self) -> None:
        self._live.discard(self)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()
