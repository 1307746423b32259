"""What every node shares: the retry policy and pubsub's size limit (Kubo's own settings are
``kubo.settings``)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Final, TypeVar

from ..errors import LimitExceededError

T = TypeVar("T")

PUBSUB_ENVELOPE_ALLOWANCE: Final = 1024
"""Bytes of libp2p's 1 MiB message limit kept for the envelope (from, seqno, signature, key)."""

MAX_PUBSUB_DATA: Final = (1 << 20) - PUBSUB_ENVELOPE_ALLOWANCE
"""Largest ``len(topic) + len(data)`` that ``publish`` accepts.

libp2p pubsub drops, silently, any message whose signed envelope is over 1 MiB
(Kubo 0.42 loses an exactly-1-MiB payload), so gradstore refuses such a
publish up front instead. Announcements are a few hundred bytes."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Exponential backoff for calls that are safe to repeat: ``retries`` extra attempts.

    ``retries=None`` retries for as long as the caller keeps asking (a service
    resubscribing to its topic). The one retry policy of the project: every
    retry loop takes its sleeps from ``delays`` (or lets ``call`` loop).
    """

    retries: int | None = 3
    backoff: float = 0.1
    factor: float = 2.0
    max_backoff: float = 2.0

    def delays(self) -> Iterator[float]:
        """Sleep before each retry: backoff, backoff*factor, ... capped at max_backoff."""
        delay = self.backoff
        for _ in range(self.retries) if self.retries is not None else itertools.count():
            yield min(delay, self.max_backoff)
            delay = min(delay * self.factor, self.max_backoff)

    async def call(
        self, attempt: Callable[[], Awaitable[T]], *, retry_on: Callable[[Exception], bool]
    ) -> T:
        """``await attempt()``, again after each delay while it raises what ``retry_on`` accepts.

        The last failure, or the first that ``retry_on`` refuses, is raised as it is.
        """
        delays = self.delays()
        while True:
            try:
                return await attempt()
            except Exception as error:
                delay = next(delays, None)
                if delay is None or not retry_on(error):
                    raise
            await asyncio.sleep(delay)


def check_pubsub_size(topic: str, data: bytes) -> None:
    """``LimitExceededError`` unless the topic and payload fit in one pubsub message."""
    size = len(topic.encode("utf-8")) + len(data)
    if size > MAX_PUBSUB_DATA:
        raise LimitExceededError(
            f"pubsub message of {len(data)} bytes on a {size - len(data)}-byte topic is over "
            f"the {MAX_PUBSUB_DATA}-byte limit (libp2p drops messages over 1 MiB)",
            "max_pubsub_bytes",
        )
