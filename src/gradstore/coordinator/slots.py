"""Per-round, per-peer state: pending -> received(cid) -> verified -> aggregated, or failed(reason)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum

from ..format import Gradient


class PeerState(StrEnum):
    PENDING = "pending"
    RECEIVED = "received"
    VERIFIED = "verified"
    AGGREGATED = "aggregated"
    FAILED = "failed"


@dataclass
class PeerSlot:
    """What the coordinator knows of one expected peer in the open round."""

    peer: str
    state: PeerState = PeerState.PENDING
    cid: str | None = None
    num_samples: int = 0
    reason: str | None = None
    gradient: Gradient | None = field(default=None, repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    nbytes: int = 0

    @property
    def settled(self) -> bool:
        """Nothing more will happen to this peer in this round without a new announcement."""
        return self.state in (PeerState.VERIFIED, PeerState.FAILED, PeerState.AGGREGATED)

    def fail(self, reason: str) -> None:
        self.state = PeerState.FAILED
        self.reason = reason
        self.gradient = None


def schema_of(gradient: Gradient) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """(name, dtype, shape) of every tensor, sorted by name: what every input of a job must share."""
    return tuple(
        (
            name,
            arr.dtype.newbyteorder("<").str if arr.dtype.itemsize > 1 else arr.dtype.str,
            tuple(arr.shape),
        )
        for name, arr in sorted(gradient.tensors.items(), key=lambda kv: kv[0].encode())
    )
