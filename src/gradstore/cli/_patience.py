"""Waiting on a node, never silently: a "waiting for ..." line on stderr after a few seconds
without progress, and a timeout counted from the last progress (``--timeout``).

Kubo waits for a block nobody serves for as long as it is asked to, so without this a
command of a missing CID sat silent for minutes. The timeout counts from the last sign of
progress (every MiB moved), not from the start, so a large transfer that keeps moving is
never cut off, and a stalled one gives up after ``--timeout`` seconds. Given the CID it
fetches and a ``StallReport``, the line also says why it may never come (the node has no
peers, or no provider of it).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TextIO, TypeVar

from ..errors import NodeTimeoutError

if TYPE_CHECKING:
    from ..dag import CID
    from ._sources import StallReport

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0
"""What ``--timeout`` is when not given (the parsers' help texts repeat it)."""

NOTICE_S = 3.0
"""Seconds without progress before the "waiting for" line."""

_TICK_S = 0.25


class Patience:
    """Runs one command's node work; ``progress`` (a ``(done, total)`` callback) marks progress.

    ``what`` names what is awaited in both messages (``bafk... from kubo http://...``);
    ``timeout`` is seconds without progress, None or 0 for no limit. With ``fetching`` (the
    CID fetched, and a ``StallReport`` on the node), a stall also says why it may last.
    """

    def __init__(
        self,
        what: str,
        timeout: float | None,
        *,
        then: Callable[[int, int], None] | None = None,
        stream: TextIO | None = None,
        notice_after: float = NOTICE_S,
        fetching: tuple[CID, StallReport] | None = None,
    ) -> None:
        self.what = what
        self.timeout = timeout or None
        self.then = then
        self.stream = stream
        self.notice_after = notice_after
        self.fetching = fetching
        self._last = time.monotonic()
        self._start = self._last
        self._noticed = False
        self._moves = 0
        self._told: str | None = None

    def progress(self, done: int = 0, total: int = 0) -> None:
        """Something moved: the clocks start again (and the next stall is announced again)."""
        self._last = time.monotonic()
        self._noticed = False
        self._moves += 1
        self._told = None
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
                why = self._why()
                if not self._noticed and idle >= self.notice_after:
                    self._noticed, self._told = True, why
                    because = f": {why}" if why else ""
                    self._say(
                        f"waiting for {self.what}{because} (Ctrl-C to stop{self._limit_text()})"
                    )
                elif self._noticed and why and self._told is None:  # the node answered late
                    self._told = why
                    self._say(f"still waiting for {self.what}: {why}")
                if self.timeout is not None and idle >= self.timeout:
                    because = f" ({self._told})" if self._told else ""
                    raise NodeTimeoutError(
                        f"gave up waiting for {self.what}: nothing arrived for "
                        f"{self.timeout:g} s{because} (--timeout S waits longer, --timeout 0 "
                        "forever)"
                    )
        finally:
            if self.fetching is not None:
                await self.fetching[1].aclose()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _why(self) -> str | None:
        """Why the fetch stalls, once the node said (None: no fetch watched, or no reason)."""
        if self.fetching is None:
            return None
        cid, report = self.fetching
        report.watch(cid, self._moves)
        return report.reason()

    def _limit_text(self) -> str:
        if self.timeout is None:
            return ""
        return f"; gives up after {self.timeout:g} s without progress, see --timeout"

    def _say(self, line: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(line + "\n")
        stream.flush()
