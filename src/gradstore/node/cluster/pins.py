"""Pins kept by IPFS Cluster at a replication factor: ``pin`` returns once the CID is pinned
on ``replication_min`` peers, or raises ``ReplicationError`` saying which peers lack it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Final

from ...dag import CID
from ...errors import ConfigError, ReplicationError
from .rest import ClusterClient
from .status import PinStatus

#: How long ``pin`` waits for the minimum replication, per call (a close retries it).
DEFAULT_WAIT_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class Replication:
    """How many cluster peers pin each CID: at least ``min`` (a pin waits for them), at most
    ``max``; ``wait_s`` bounds one wait."""

    min: int = 1
    max: int = 1
    wait_s: float = DEFAULT_WAIT_S

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max:
            raise ConfigError(
                f"replication_min {self.min} and replication_max {self.max}: "
                "need 1 <= replication_min <= replication_max"
            )


class ClusterPins:
    """Pins through ``client`` at ``replication``; waits poll the status with backoff."""

    def __init__(self, client: ClusterClient, replication: Replication) -> None:
        self.client = client
        self.replication = replication

    async def pin(self, cid: CID, *, recursive: bool = True, wait: bool = True) -> None:
        """Ask the cluster to pin ``cid``; with ``wait``, return once ``replication.min``
        peers hold it (``ReplicationError`` after ``replication.wait_s``)."""
        r = self.replication
        await self.client.pin(
            cid, replication_min=r.min, replication_max=r.max, recursive=recursive
        )
        if wait:
            await self.wait(cid)

    async def wait(self, cid: CID) -> PinStatus:
        """The status once ``replication.min`` peers pin ``cid``; polled at 0.05 s doubling
        to 2 s, ``ReplicationError`` after ``replication.wait_s``."""
        need, deadline, delay = (
            self.replication.min,
            time.monotonic() + self.replication.wait_s,
            0.05,
        )
        while True:
            status = await self.client.status(cid)
            if status.pinned >= need:
                return status
            if time.monotonic() >= deadline:
                raise ReplicationError(
                    f"{cid} is pinned on {status.pinned} of the {need} peers replication_min "
                    f"asks for after {self.replication.wait_s:g}s: {status.describe()}"
                )
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 2.0)

    async def unpin(self, cid: CID) -> None:
        """Drop the cluster's pin of ``cid`` (none: nothing happens)."""
        await self.client.unpin(cid)

    async def aclose(self) -> None:
        await self.client.aclose()
