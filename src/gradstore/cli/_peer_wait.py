"""``peer publish`` and ``peer await`` never wait in silence: after a few seconds a line on
stderr says what they wait for, and then again when that changes.

They used to print nothing for 12-15 s while the coordinator's own terminal showed the round
(issue 24). Now: with no coordinator heard, that (and how long until they give up); once it
is heard, the round's progress from its signed statuses (verified of expected, quorum, the
deadline it signed); once the round closed, the aggregate being fetched, and, when that
stalls, why it may never come (``_sources``: the node has no peers, or no provider).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import TextIO, TypeVar

from ..peer import Peer
from ._patience import NOTICE_S
from ._sources import StallReport

T = TypeVar("T")

_TICK_S = 0.25

#: The coordinator repeats its statuses every 2 s: silence this long after it was heard is news.
_SILENCE_S = 5.0


class PeerWaitLines:
    """Runs one peer command's wait on ``peer`` for ``round_`` (its ``step``), saying what it
    waits for: ``publishing`` for a peer's own verdict, else for the round's result.

    The first line comes after ``notice_after`` s; then one when what it says changes (at
    most every ``min_gap_s``), and every ``every_s`` otherwise, so a countdown still shows.
    """

    def __init__(
        self,
        peer: Peer,
        round_: int,
        step: str | None,
        *,
        publishing: bool,
        stream: TextIO | None = None,
        notice_after: float = NOTICE_S,
        every_s: float = 10.0,
        min_gap_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.peer = peer
        self.round = round_
        self.step = step
        self.publishing = publishing
        self.stream = stream
        self.notice_after = notice_after
        self.every_s = every_s
        self.min_gap_s = min_gap_s
        self.clock = clock
        self.stall = StallReport(peer.node, probe_after=max(0.0, notice_after - 2.0))
        self._start = time.monotonic()
        self._shown: Hashable = None
        self._at = float("-inf")

    async def run(self, work: Awaitable[T]) -> T:
        """Await ``work``, with a line on stderr whenever one is due."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_TICK_S)
                if done:
                    return task.result()
                self.tick(time.monotonic())
        finally:
            await self.stall.aclose()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def tick(self, now: float) -> None:
        """Print the current line if it is due (``now``: monotonic seconds)."""
        key, line = self.describe()
        if now - self._start < self.notice_after:
            return
        changed = key != self._shown and now - self._at >= self.min_gap_s
        if self._shown is None or changed or now - self._at >= self.every_s:
            stream = self.stream or sys.stderr
            stream.write(line + "\n")
            stream.flush()
            self._shown, self._at = key, now

    def describe(self) -> tuple[Hashable, str]:
        """What is awaited now, as (what identifies it, the line that says it)."""
        peer = self.peer
        what = f"round {self.round}" + ("" if self.step is None else f", step {self.step!r}")
        fetching = peer.fetching
        if fetching is not None:
            self.stall.watch(fetching, peer.fetched_bytes)
            why = self.stall.reason()
            line = f"{what} closed: fetching its aggregate {fetching} from {peer.node.name}"
            return ("fetch", str(fetching), why), line + (f" ({why})" if why else "")
        silent = peer.silent_for()
        if peer.run is None or silent >= _SILENCE_S:
            return ("silent", peer.heard), _no_coordinator(peer, silent)
        wait = peer.round_wait(self.round, self.step)
        if wait is None:
            run = peer.view.current
            at = "" if run is None else f"; it is at round {run.open_round}"
            return ("unheard",), f"{what}: no status of it from the coordinator yet{at}"
        counts = wait.counts(int(self.clock() * 1000))
        key = ("round", wait.verified, wait.received, wait.deadline_ms, wait.steps_ended)
        if self.publishing:
            return (
                key,
                f"{what}: waiting for the coordinator to verify this peer's input ({counts})",
            )
        return key, f"{what}: waiting for its result ({counts})"


def _no_coordinator(peer: Peer, silent: float) -> str:
    """The line of a wait with no coordinator to hear, and when the peer gives up."""
    config = peer.config
    heard = "has been silent" if peer.heard else "has not been heard"
    return (
        f"waiting for the coordinator of job {config.job}: it {heard} for {silent:.0f} s on "
        f"{config.results_topic} (is `gradstore coordinator` running, and connected to this "
        f"node? gives up after {peer.coordinator_timeout_s:g} s of silence)"
    )
