"""Waking the waiters a coordinator message concerns, not every waiter of the process.

A peer that announced its 64 steps waits on 64 verdicts at once, and a process of several
peers sharing one subscription on all of theirs. Woken by every message, each waiter checked
its condition again: 256 waiters x 250 messages of a 64-step round were 64,000 checks (most
of the peers' CPU in ``python -m benchmarks steps``). A waiter on one step's verdict now
sleeps through the other steps' messages.
"""

from __future__ import annotations

import asyncio
from typing import Final

#: Wait on every message (a round's own, a step's, any run's): the default.
EVERY: Final = object()


class News:
    """Futures by what their waiter is about: a step's name, or ``EVERY`` message."""

    def __init__(self) -> None:
        self._waiters: dict[object, set[asyncio.Future[None]]] = {}

    async def wait(self, about: object = EVERY) -> None:
        """Until a message about ``about`` (any message for ``EVERY``) is announced."""
        future = asyncio.get_running_loop().create_future()
        waiting = self._waiters.setdefault(about, set())
        waiting.add(future)
        try:
            await future
        finally:
            waiting.discard(future)
            if not waiting and self._waiters.get(about) is waiting:
                del self._waiters[about]

    def about(self, step: str | None, *, everyone: bool) -> None:
        """A message about ``step`` was taken in: wake its waiters and those on every
        message; with ``everyone`` (the round's own message, or a new run), every waiter."""
        keys = list(self._waiters) if everyone else (step, EVERY)
        for key in keys:
            for future in self._waiters.get(key, ()):
                if not future.done():
                    future.set_result(None)
