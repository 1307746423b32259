"""Where the open round stands, for the coordinator's "waiting for peers" lines.

Named ``RoundProgress``, one name per meaning: bytes moved are ``gradstore.store.ByteProgress``;
``gradstore.coordinator.Progress`` stays as an alias.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoundProgress:
    """The open round's counts and time left (``Coordinator.progress``). In a stepped job
    the counts and quorums are summed over its steps, the deadline is the next one of a
    step still pending, and ``steps`` says how many there are (0: a job without steps)."""

    round: int
    expected: int
    received: int
    verified: int
    failed: int
    quorum: int
    deadline_in: float | None  # seconds; None until the first announcement starts the clock
    steps: int = 0  # the job's steps (0: a job without steps)
    steps_closed: int = 0
    steps_failed: int = 0
    peers: int = 0  # peers with an accepted announcement in the round (any step)
    held_bytes: int = 0  # verified inputs held in memory for aggregation

    @property
    def steps_pending(self) -> int:
        """Steps neither closed nor failed yet (a job without steps: its one step, 1)."""
        return max(1, self.steps) - self.steps_closed - self.steps_failed

    def line(self) -> str:
        """``round 0: waiting for peers (1/3 verified, 2 received, deadline in 41 s)``;
        a stepped job's adds ``steps 1/3 closed, 1 failed; 3 peers, 1.2 MB held``."""
        clock = (
            "the deadline starts at the first announcement"
            if self.deadline_in is None
            else f"deadline in {max(0.0, self.deadline_in):.0f} s"
        )
        failed = f", {self.failed} refused" if self.failed else ""
        steps = ""
        if self.steps:
            steps = f"steps {self.steps_closed}/{self.steps} closed"
            steps += f", {self.steps_failed} failed" if self.steps_failed else ""
            steps += f"; {self.peers} peers, {self.held_bytes / 1e6:.1f} MB held; "
        return (
            f"round {self.round}: waiting for peers ({steps}{self.verified}/{self.expected} "
            f"verified, {self.received} received{failed}, quorum {self.quorum}, {clock})"
        )
