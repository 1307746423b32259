"""Step outputs kept in memory from a step's close until its round's model-level output.

A step's aggregate is stored when the step closes; the round's model-level output, stored
once every step is over, holds the same tensors (``store.put_model``). Reading them back
from the node cost 4 Kubo requests a step (256 in a round of 64 steps) and hashed every
byte again, though the coordinator had just put them. It keeps them instead, up to
``limit`` bytes in all (the model's aggregate at most, since steps partition the tensors:
memory stays O(model)); a step over the limit, or one closed before a restart, is read
back from the node as before. The model-level CID is the same either way.
"""

from __future__ import annotations

from ..dag import CID
from ..format import Gradient


class HeldOutputs:
    """Each open round's step outputs by output CID, ``limit`` bytes at most in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._rounds: dict[int, dict[CID, Gradient]] = {}

    def hold(self, round_: int, cid: CID, output: Gradient) -> bool:
        """Keep ``output`` (stored as ``cid``) for ``round_``'s model-level output, if it
        fits; whether it was kept."""
        size = output.nbytes
        if self.used + size > self.limit:
            return False
        self.used += size
        self._rounds.setdefault(round_, {})[cid] = output
        return True

    def of(self, round_: int) -> dict[CID, Gradient]:
        """The outputs kept for ``round_``."""
        return self._rounds.get(round_, {})

    def drop(self, round_: int) -> None:
        """``round_`` is over: its outputs go."""
        for output in self._rounds.pop(round_, {}).values():
            self.used -= output.nbytes
