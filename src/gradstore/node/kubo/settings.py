"""Kubo's settings, as small classes with named defaults: where its API is, the timeouts of an
RPC call, and how long to wait for a launched daemon."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import httpx

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
class DaemonSettings:
    """How long to wait for a launched Kubo daemon to start and to stop."""

    start_timeout: float = 30.0
    stop_grace: float = 10.0
    poll_interval: float = 0.05


DEFAULT_TIMEOUTS: Final = Timeouts()
DEFAULT_DAEMON_SETTINGS: Final = DaemonSettings()
