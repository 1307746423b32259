"""Timeouts, retry policy and limits of the node layer, as small classes with named defaults."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Final, TypeVar

import httpx

from ..errors import LimitExceededError

T = TypeVar("T")

PUBSUB_ENVELOPE_ALLOWANCE: Final = 1024
"""Bytes of libp2p's 1 MiB message limit kept for the envelope (from, seqno, signature, key)."""

MAX_PUBSUB_DATA: Final = (1 << 20) - PUBSUB_ENVELOPE_ALLOWANCE
"""Largest ``len(topic) + len(data)`` that ``publish`` accepts.

libp2p pubsub drops, silently, any message whose signed envelope is over 1 MiB
(Kubo 0.42 loses an exactly-1-MiB payload), so gradstore refuses such a
publish up front instead. Announcements are a few hundred bytes."""

UPLOAD_CHUNK: Final = 256 * 1024
"""Request bodies go out in slices of at most this many bytes (bounded copies in the HTTP stack)."""

DEFAULT_API: Final = "http://127.0.0.1:5001"


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds allowed for each phase of an RPC call (``read``: between bytes, not the whole body).

    ``pubsub`` readers never time out on read: a quiet topic is not an error.
    """

    connect: float = 5.0
    read: float = 120.0
    write: float = 120.0
    pool: float = 30.0

    def to_httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect, read=self.read, write=self.write, pool=self.pool)

    def streaming(self) -> httpx.Timeout:
        """The same limits with no read timeout, for long-lived subscription streams."""
        return httpx.Timeout(connect=self.connect, read=None, write=self.write, pool=self.pool)


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


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """How long to wait for a launched Kubo daemon to start and to stop."""

    start_timeout: float = 30.0
    stop_grace: float = 10.0
    poll_interval: float = 0.05


DEFAULT_TIMEOUTS: Final = Timeouts()
DEFAULT_DAEMON_SETTINGS: Final = DaemonSettings()


def check_pubsub_size(topic: str, data: bytes) -> None:
    """``LimitExceededError`` unless the topic and payload fit in one pubsub message."""
    size = len(topic.encode("utf-8")) + len(data)
    if size > MAX_PUBSUB_DATA:
        raise LimitExceededError(
            f"pubsub message of {len(data)} bytes on a {size - len(data)}-byte topic is over "
            f"the {MAX_PUBSUB_DATA}-byte limit (libp2p drops messages over 1 MiB)",
            "max_pubsub_bytes",
        )
