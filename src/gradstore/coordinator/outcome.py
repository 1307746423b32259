"""How a round ended, and the one line the CLI prints and the coordinator logs for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..dag import CID


@dataclass(frozen=True)
class RoundOutcome:
    """How one round ended: closed with an aggregate and record, or failed with a reason."""

    round: int
    status: str  # "closed" | "failed"
    output: CID | None
    record: CID | None
    peers: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...]
    reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)


def format_outcome(outcome: RoundOutcome) -> str:
    """The one-line summary of a round printed by the CLI and logged."""
    s = outcome.stats
    counts = f"{s.get('verified', 0)}/{s.get('expected', 0)} verified"
    if outcome.status == "failed":
        return f"round {outcome.round} failed: {outcome.reason} ({counts})"
    return (
        f"round {outcome.round} closed: {len(outcome.peers)} peers ({counts}), "
        f"aggregate {outcome.output} record {outcome.record}, "
        f"{s.get('bytes_fetched', 0) / 1e6:.1f} MB fetched in {s.get('resolve_s', 0):.2f}s, "
        f"aggregate {s.get('aggregate_s', 0):.2f}s, publish {s.get('publish_s', 0):.2f}s"
    )
