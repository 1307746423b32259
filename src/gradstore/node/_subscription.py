"""What every pubsub subscription shares: an unbounded queue read by ``async for`` / ``get``.

A subclass starts delivery in ``_activate`` (idempotent; errors raise from
``ready()``) and stops it in ``_deactivate``; it feeds ``self._queue`` with
messages, or with an exception that every later read re-raises.
"""

from __future__ import annotations

import asyncio
from typing import Self

from .._closing import AsyncClosing
from ..errors import NodeError
from .base import PubsubMessage

_CLOSED = object()


class QueuedSubscription(AsyncClosing):
    """Base of ``KuboSubscription`` and ``LocalSubscription``."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._closed = False

    async def _activate(self) -> None:
        raise NotImplementedError

    async def _deactivate(self) -> None:
        raise NotImplementedError

    async def ready(self) -> None:
        """Start the subscription (once) and return when it is active."""
        if self._closed:
            raise NodeError(f"{self!r} is closed")
        await self._activate()

    async def __aenter__(self) -> Self:
        await self.ready()
        return self

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> PubsubMessage:
        if not self._closed:
            await self.ready()
        elif self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _CLOSED:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)  # every later read fails the same way
            raise item
        assert isinstance(item, PubsubMessage)
        return item

    async def get(self, timeout: float | None = None) -> PubsubMessage:
        """The next message; ``TimeoutError`` after ``timeout`` s, ``NodeError`` once closed."""
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except StopAsyncIteration:
            raise NodeError(f"{self!r} is closed") from None

    async def aclose(self) -> None:
        """Stop delivery; iteration then ends after the messages already queued."""
        if self._closed:
            return
        self._closed = True
        await self._deactivate()
        self._queue.put_nowait(_CLOSED)
