"""Where the open round stands, for the coordinator's "waiting for peers" lines.

Named ``RoundProgress``, one name per meaning: bytes moved are ``gradstore.store.ByteProgress``;
``gradstore.coordinator.Progress`` stays as an alias.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoundProgress:
    """The open round's counts and time left (``Coordinator.progress``)."""

    round: int
    expected: int
    received: int
    verified: int
    failed: int
    quorum: int
    deadline_in: float | None  # seconds; None until the first announcement starts the clock

    def line(self) -> str:
        """``round 0: waiting for peers (1/3 verified, 2 received, deadline in 41 s)``."""
        clock = (
            "the deadline starts at the first announcement"
            if self.deadline_in is None
            else f"deadline in {max(0.0, self.deadline_in):.0f} s"
        )
        failed = f", {self.failed} refused" if self.failed else ""
        return (
            f"round {self.round}: waiting for peers ({self.verified}/{self.expected} verified, "
            f"{self.received} received{failed}, quorum {self.quorum}, {clock})"
        )
