"""The beacon's schedule: when each step's last message is repeated, with backoff.

Pubsub drops messages and peers refuse stale ones, so the coordinator repeats what a peer
may have missed, re-signed with a fresh stamp, once per beacon period. Repeating every
step's message every period made a round's messages O(steps x time): 64 open steps cost
32 publishes a second at a 2 s period. Here each step's last message (an open step's
status, a closed step's result, a failed step's failure) is repeated 1, 2, 4 and 8
periods after it last changed, then every 8 periods: O(log(time)) repeats per change.
A change is published at once by the status publisher, so the repeats only serve peers
that missed it. What a peer asks about again (a re-announcement) is repeated at the next
period, once. Pure: the state calls it, no I/O, no clock (periods are counted).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Final, Generic, TypeVar

#: Periods after a change at which a message is repeated; then every ``CAP_PERIODS``.
FIRST_REPEATS: Final = (1, 2, 4)
CAP_PERIODS: Final = 8

K = TypeVar("K", bound=Hashable)


def due_at(age: int) -> bool:
    """Whether a message unchanged for ``age`` beacon periods is repeated in this one:
    after 1, 2, 4 and 8 periods, then every 8."""
    return age in FIRST_REPEATS or (age >= CAP_PERIODS and age % CAP_PERIODS == 0)


class Backoff(Generic[K]):
    """For each message (by key): the period it last changed in and the last it went out."""

    def __init__(self) -> None:
        self.period = 0  # beacon periods begun so far
        self._changed: dict[K, int] = {}
        self._sent: dict[K, int] = {}
        self._asked: set[K] = set()

    def changed(self, key: K) -> None:
        """``key``'s message changed (and went out at once): its backoff starts again."""
        self._changed[key] = self.period

    def ask(self, key: K) -> None:
        """A peer asked about ``key`` again: repeat its message at the next period, once."""
        self._asked.add(key)

    def next_period(self) -> None:
        """A beacon period begins."""
        self.period += 1

    def due(self, key: K) -> bool:
        """Whether ``key``'s message is repeated in this period (a key never seen changed
        counts as changed now)."""
        if key in self._asked:
            return True
        return due_at(self.period - self._changed.setdefault(key, self.period))

    def sent(self, keys: Iterable[K]) -> None:
        """The beacon repeated ``keys``' messages in this period."""
        for key in keys:
            self._sent[key] = self.period
            self._asked.discard(key)

    def stalest(self, keys: Iterable[K]) -> K | None:
        """Of ``keys``, the one whose message the beacon repeated longest ago (None: none)."""
        return min(keys, key=lambda k: self._sent.get(k, -1), default=None)

    def drop(self, gone: Callable[[K], bool]) -> None:
        """Forget the keys ``gone`` says are over (their round ended)."""
        for table in (self._changed, self._sent):
            for key in [k for k in table if gone(k)]:
                del table[key]
        self._asked = {k for k in self._asked if not gone(k)}
