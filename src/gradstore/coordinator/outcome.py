"""How a round ended, and the one line the CLI prints and the coordinator logs for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..dag import CID


@dataclass(frozen=True)
class RoundOutcome:
    """How one round (or one step of a stepped round) ended: closed with an aggregate and
    record, or failed with a reason. A stepped round's outcome has its model-level output,
    its round/5 record, and ``steps``: the outcomes of the steps closed in this run."""

    round: int
    status: str  # "closed" | "failed"
    output: CID | None
    record: CID | None
    peers: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...]
    reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    step: str | None = None  # the step of a stepped job's step outcome
    steps: tuple[RoundOutcome, ...] = ()


def format_outcome(outcome: RoundOutcome) -> str:
    """The one-line summary of a round (or step) printed by the CLI and logged."""
    s = outcome.stats
    what = f"round {outcome.round}" + ("" if outcome.step is None else f" step {outcome.step}")
    if "steps" in s:  # a stepped round
        steps = s["steps"]
        counts = f"{steps['completed']}/{steps['total']} steps closed, {steps['failed']} failed"
        if outcome.status == "failed":
            return f"{what} failed: {outcome.reason} ({counts})"
        if outcome.record is None:  # a part: the job's coordinator writes the round's record
            return f"{what}: its steps are over here: {counts}, {len(outcome.peers)} peers"
        return (
            f"{what} closed: {counts}, {len(outcome.peers)} peers, "
            f"model output {outcome.output} record {outcome.record}"
        )
    if "groups" in s:  # a tree round, at its root
        groups = s["groups"]
        counts = f"{groups.get('completed', 0)}/{groups['total']} groups closed"
        if outcome.status == "failed":
            return f"{what} failed: {outcome.reason} ({counts})"
        return (
            f"{what} closed: {counts}, {len(outcome.peers)} peers, "
            f"output {outcome.output} record {outcome.record}"
        )
    counts = f"{s.get('verified', 0)}/{s.get('expected', 0)} verified"
    if outcome.status == "failed":
        return f"{what} failed: {outcome.reason} ({counts})"
    return (
        f"{what} closed: {len(outcome.peers)} peers ({counts}), "
        f"aggregate {outcome.output} record {outcome.record}, "
        f"{s.get('bytes_fetched', 0) / 1e6:.1f} MB fetched in {s.get('resolve_s', 0):.2f}s, "
        f"aggregate {s.get('aggregate_s', 0):.2f}s, publish {s.get('publish_s', 0):.2f}s"
    )
