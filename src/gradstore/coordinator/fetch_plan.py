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
backward pass finishes first, closes first. A peer's inputs come over one uplink (its
node's): fetched all at once they share it, so its first step arrived no sooner than its
last and no aggregate went back until the end (2 peers on 100 Mbit/s links, 8 steps of
12.8 MB: every step closed after the last had come in). So a first attempt waits while
its peer's attempts in flight already hold ``per_peer_bytes`` (by the sizes the steps'
schemas give; one attempt always may run): held back, a peer's inputs keep their order and
go as its running ones end. Small inputs are not held (64 steps of 1 MiB still run side
by side, where loopback's fetches are short of CPU, not of bandwidth), nor inputs of a
size not known yet (no ``[[schema]]``, a step's first round), nor retries (they run on at
most half of the workers), which count all the same.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ..node import Retry

#: Attempts per input before it fails as unavailable.
DEFAULT_ATTEMPTS: Final = 4

#: Bytes of one peer's inputs in flight before its next first attempt waits.
PER_PEER_BYTES: Final = 8 << 20

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
        per_peer_bytes: int = PER_PEER_BYTES,
    ) -> None:
        self.workers = workers
        self.per_peer_bytes = per_peer_bytes
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
        self._size: dict[Key, int] = {}  # an input's expected bytes (0: not known)
        self._busy: Counter[str] = Counter()  # peer -> its attempts holding a worker
        self._flight: Counter[str] = Counter()  # peer -> their expected bytes
        self._held: dict[str, list[_Entry]] = {}  # peer -> first attempts over its cap
        self._seq = itertools.count()

    def add(self, key: Key, rank: int = 0, size: int = 0) -> None:
        """Queue a first attempt (no-op if the input is queued or being fetched); a lower
        ``rank`` (its step's index in backward order) goes first; ``size``: its expected
        bytes (0: not known)."""
        if key in self._queued or key in self._running or key in self._pinning:
            return
        self._queued.add(key)
        self._rank[key] = rank
        self._size[key] = size
        heapq.heappush(self._fresh, _Entry(0.0, 0, rank, next(self._seq), key))

    def drop(self, key: Key) -> None:
        """Forget an input (its round moved on, or it settled)."""
        self._queued.discard(key)
        self._tried.pop(key, None)
        if key not in self._running and key not in self._pinning:
            self._rank.pop(key, None)
            self._size.pop(key, None)

    def drop_round(self, round_: int) -> None:
        self.drop_where(lambda k: k[0] == round_)

    def drop_where(self, which: Callable[[Key], bool]) -> None:
        """Forget every queued or tried input whose key ``which`` takes (a closed step's)."""
        for key in [k for k in (*self._queued, *self._tried) if which(k)]:
            self.drop(key)
        for peer, held in list(self._held.items()):
            kept = [e for e in held if e.key in self._queued]
            if kept:
                heapq.heapify(kept)
                self._held[peer] = kept
            else:
                del self._held[peer]

    @property
    def running(self) -> int:
        """Attempts that hold a worker (not those only waiting for their pin)."""
        return len(self._running)

    def pinning(self, key: Key) -> None:
        """``key``'s attempt passed its checks and only waits for its pin: its worker is
        free for another fetch (it still ends with ``finished`` or ``retry``)."""
        if key in self._running:
            self._pinning[key] = self._running.pop(key)
            self._release(key)

    def next(self, now: float) -> tuple[Key | None, float | None]:
        """The input to fetch now, if any; else when to look again (None: on news only)."""
        if len(self._running) < self.workers:
            while self._fresh:
                entry = heapq.heappop(self._fresh)
                if entry.key not in self._queued:
                    continue
                peer = entry.key[1]
                if not self._fits(peer, self._size.get(entry.key, 0)):  # in its turn
                    heapq.heappush(self._held.setdefault(peer, []), entry)
                    continue
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

    def _fits(self, peer: str, size: int) -> bool:
        """May one more of ``peer``'s inputs (``size`` bytes) start beside its others?"""
        return not self._busy[peer] or self._flight[peer] + size <= self.per_peer_bytes

    def _start(self, entry: _Entry) -> Key:
        key, peer = entry.key, entry.key[1]
        self._queued.discard(key)
        self._running[key] = entry.attempt
        self._busy[peer] += 1
        self._flight[peer] += self._size.get(key, 0)
        return key

    def _release(self, key: Key) -> None:
        """``key``'s attempt no longer holds a worker: its peer's next held inputs, as
        many as now fit, go back in the queue."""
        peer = key[1]
        self._busy[peer] -= 1
        self._flight[peer] -= self._size.get(key, 0)
        if self._busy[peer] <= 0:
            del self._busy[peer], self._flight[peer]
        held = self._held.get(peer, [])
        flight, busy = self._flight[peer], self._busy[peer]
        while held:
            entry = held[0]
            size = self._size.get(entry.key, 0)
            if entry.key in self._queued:
                if busy and flight + size > self.per_peer_bytes:
                    break
                flight, busy = flight + size, busy + 1
                heapq.heappush(self._fresh, entry)
            heapq.heappop(held)
        if not held:
            self._held.pop(peer, None)

    def finished(self, key: Key) -> None:
        """The attempt succeeded or failed for good: the input leaves the plan."""
        if self._running.pop(key, None) is not None:
            self._release(key)
        self._pinning.pop(key, None)
        self.drop(key)

    def retry(self, key: Key, now: float) -> float | None:
        """The attempt failed for a passing reason: when it will be tried again, or None
        when its budget is spent (the input then fails as unavailable)."""
        if key in self._running:
            attempt = self._running.pop(key) + 1
            self._release(key)
        else:
            attempt = self._pinning.pop(key, 0) + 1
        self._tried[key] = attempt
        if attempt >= self.attempts:
            self.drop(key)
            return None
        delay = next(itertools.islice(self.backoff.delays(), attempt - 1, None))
        self._queued.add(key)
        rank = self._rank.get(key, 0)
        heapq.heappush(self._later, _Entry(now + delay, attempt, rank, next(self._seq), key))
        return now + delay
