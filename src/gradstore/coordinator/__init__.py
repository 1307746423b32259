"""The event-driven aggregation coordinator (DESIGN section 6)."""

from .journal import Journal
from .service import Coordinator, RoundOutcome, format_outcome
from .slots import PeerSlot, PeerState

__all__ = ["Coordinator", "Journal", "PeerSlot", "PeerState", "RoundOutcome", "format_outcome"]
