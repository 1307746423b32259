"""Which announced input to fetch next, and when to try again: pure, no I/O.

A fetch worker takes an input, makes one bounded attempt, and gives the worker back:
it never holds its place while waiting to retry. First attempts go before retries, and
retries may use only part of the workers, so peers that announce CIDs nobody serves
cannot keep honest inputs waiting (a Byzantine-robust method would otherwise be defeated
without a single bad gradient). Each input has a budget of attempts, after which it
fails as unavailable; the waits between them are ``FETCH_RETRY``'s (the project's one
backoff, ``node.Retry``), which Flower's strategy waits by too.

An attempt whose input passed its checks and only waits for its pin (``pinning``) gives
its worker back: pins take a node's lock and its disk's sync (about 25 ms a call on Kubo),
and with every worker waiting on them the fetches stood still (a round of 256 inputs of
1 MiB spent 40% of its attempts' time there); another fetch starts meanwhile, and the
inputs pinning together are pinned in one call (``pinner``).

In a stepped job each input has its step's rank (its index in the job's backward order):
first attempts go to the step that comes first, so the output layer's step, which a
backward pass finishes first, closes first.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ..node import Retry

#: Attempts per input before it fails as unavailable.
DEFAULT_ATTEMPTS: Final = 4

#: The waits before an input's second, third, ... attempt: 0.5 s, doubling, at most 5 s.
FETCH_RETRY: Final = Retry(retries=DEFAULT_ATTEMPTS - 1, backoff=0.5, max_backoff=5.0)


#: An input's key: ``(round, peer)``, or ``(round, peer, step)`` (``steps.Key``).
Key = tuple[int, str] | tuple[int, str, str]


@dataclass(order=True)
class _Entry:
    ready_at: float
    attempt: int
    rank: int  # the input's step in backward order: the first step's inputs go first
    seq: int
    key: Key = field(compare=False)


class FetchPlan:
    """A queue of inputs to fetch, keyed by (round, peer[, step]), with retry backoff and
    budgets."""

    def __init__(
        self,
        workers: int,
        *,
        attempts: int = DEFAULT_ATTEMPTS,
        first_delay_s: float = FETCH_RETRY.backoff,
        max_delay_s: float = FETCH_RETRY.max_backoff,
    ) -> None:
        self.workers = workers
        self.attempts = attempts
        self.backoff = Retry(
            retries=max(0, attempts - 1), backoff=first_delay_s, max_backoff=max_delay_s
        )
        self.retry_workers = max(1, workers // 2)
        self._fresh: list[_Entry] = []  # first attempts, in arrival order
        self._later: list[_Entry] = []  # retries, by ready time
        self._tried: dict[Key, int] = {}  # attempts made so far
        self._queued: set[Key] = set()
        self._running: dict[Key, int] = {}  # key -> its attempt number
        self._pinning: dict[Key, int] = {}  # attempts that only wait for their pin
        self._rank: dict[Key, int] = {}
        self._seq = itertools.count()

    def add(self, key: Key, rank: int = 0) -> None:
        """Queue a first attempt (no-op if the input is queued or being fetched); a lower
        ``rank`` (its step's index in backward order) goes first."""
        if key in self._queued or key in self._running or key in self._pinning:
            return
        self._queued.add(key)
        self._rank[key] = rank
        heapq.heappush(self._fresh, _Entry(0.0, 0, rank, next(self._seq), key))

    def drop(self, key: Key) -> None:
        """Forget an input (its round moved on, or it settled)."""
        self._queued.discard(key)
        self._tried.pop(key, None)
        if key not in self._running and key not in self._pinning:
            self._rank.pop(key, None)

    def drop_round(self, round_: int) -> None:
        self.drop_where(lambda k: k[0] == round_)

    def drop_where(self, which: Callable[[Key], bool]) -> None:
        """Forget every queued or tried input whose key ``which`` takes (a closed step's)."""
        for key in [k for k in (*self._queued, *self._tried) if which(k)]:
            self.drop(key)

    @property
    def running(self) -> int:
        """Attempts that hold a worker (not those only waiting for their pin)."""
        return len(self._running)

    def pinning(self, key: Key) -> None:
        """``key``'s attempt passed its checks and only waits for its pin: its worker is
        free for another fetch (it still ends with ``finished`` or ``retry``)."""
        if key in self._running:
            self._pinning[key] = self._running.pop(key)

    def next(self, now: float) -> tuple[Key | None, float | None]:
        """The input to fetch now, if any; else when to look again (None: on news only)."""
        if len(self._running) < self.workers:
            while self._fresh:
                entry = heapq.heappop(self._fresh)
                if entry.key in self._queued:
                    return self._start(entry), None
        retries = sum(1 for attempt in self._running.values() if attempt > 0)
        while self._later and self._later[0].key not in self._queued:
            heapq.heappop(self._later)
        if not self._later:
            return None, None
        head = self._later[0]
        if head.ready_at > now:
            return None, head.ready_at
        if len(self._running) >= self.workers or retries >= self.retry_workers:
            return None, None  # a worker coming back will look again
        heapq.heappop(self._later)
        return self._start(head), None

    def _start(self, entry: _Entry) -> Key:
        self._queued.discard(entry.key)
        self._running[entry.key] = entry.attempt
        return entry.key

    def finished(self, key: Key) -> None:
        """The attempt succeeded or failed for good: the input leaves the plan."""
        self._running.pop(key, None)
        self._pinning.pop(key, None)
        self.drop(key)

    def retry(self, key: Key, now: float) -> float | None:
        """The attempt failed for a passing reason: when it will be tried again, or None
        when its budget is spent (the input then fails as unavailable)."""
        attempt = self._running.pop(key, self._pinning.pop(key, 0)) + 1
        self._tried[key] = attempt
        if attempt >= self.attempts:
            self.drop(key)
            return None
        delay = next(itertools.islice(self.backoff.delays(), attempt - 1, None))
        self._queued.add(key)
        rank = self._rank.get(key, 0)
        heapq.heappush(self._later, _Entry(now + delay, attempt, rank, next(self._seq), key))
        return now + delay
