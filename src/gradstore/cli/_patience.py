"""Waiting on a node, never silently: a "waiting for ..." line on stderr after a few seconds
without progress, and a timeout counted from the last progress (``--timeout``).

Kubo waits for a block nobody serves for as long as it is asked to, so without this a
command of a missing CID sat silent for minutes. The timeout counts from the last sign of
progress (every MiB moved), not from the start, so a large transfer that keeps moving is
never cut off, and a stalled one gives up after ``--timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TextIO, TypeVar

from ..errors import NodeTimeoutError

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0
"""What ``--timeout`` is when not given (the parsers' help texts repeat it)."""

NOTICE_S = 3.0
"""Seconds without progress before the "waiting for" line."""

_TICK_S = 0.25


class Patience:
    """Runs one command's node work; ``progress`` (a ``(done, total)`` callback) marks progress.

    ``what`` names what is awaited in both messages (``bafk... from kubo http://...``);
    ``timeout`` is seconds without progress, None or 0 for no limit.
    """

    def __init__(
        self,
        what: str,
        timeout: float | None,
        *,
        then: Callable[[int, int], None] | None = None,
        stream: TextIO | None = None,
        notice_after: float = NOTICE_S,
    ) -> None:
        self.what = what
        self.timeout = timeout or None
        self.then = then
        self.stream = stream
        self.notice_after = notice_after
        self._last = time.monotonic()
        self._start = self._last
        self._noticed = False

    def progress(self, done: int = 0, total: int = 0) -> None:
        """Something moved: the clocks start again (and the next stall is announced again)."""
        self._last = time.monotonic()
        self._noticed = False
        if self.then is not None:
            self.then(done, total)

    async def run(self, work: Awaitable[T]) -> T:
        """Await ``work``; after ``notice_after`` s idle say so; after ``timeout`` s idle give up."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_TICK_S)
                if done:
                    return task.result()
                idle = time.monotonic() - self._last
                if not self._noticed and idle >= self.notice_after:
                    self._noticed = True
                    self._say(f"waiting for {self.what} (Ctrl-C to stop{self._limit_text()})")
                if self.timeout is not None and idle >= self.timeout:
                    raise NodeTimeoutError(
                        f"gave up waiting for {self.what}: nothing arrived for "
                        f"{self.timeout:g} s (--timeout S waits longer, --timeout 0 forever)"
                    )
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _limit_text(self) -> str:
        if self.timeout is None:
            return ""
        return f"; gives up after {self.timeout:g} s without progress, see --timeout"

    def _say(self, line: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(line + "\n")
        stream.flush()
