"""Asyncio helpers of the coordinator service: waits that start no task of their own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping
from typing import Any


async def until(event: asyncio.Event, timeout: float | None) -> None:
    """Wait until ``event`` is set or ``timeout`` seconds pass (no task of its own)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


async def relay(stop: asyncio.Event, news: asyncio.Event) -> None:
    """Set ``news`` once ``stop`` is set: one waiter on ``news`` hears of both."""
    await stop.wait()
    news.set()


async def unwrap(coro: Awaitable[None]) -> None:
    """Await ``coro``; a TaskGroup's single error is raised as itself, not as a group."""
    try:
        await coro
    except BaseExceptionGroup as group:
        errors = [e for e in group.exceptions if not isinstance(e, asyncio.CancelledError)]
        if len(errors) == 1:
            raise errors[0] from None
        raise


def under_way(tasks: Mapping[Any, asyncio.Task[Any]]) -> bool:
    """Whether any of ``tasks`` has not ended yet."""
    return not all(task.done() for task in tasks.values())
