"""The meta of a stepped round's documents: a step's aggregate and the model-level output.

What anyone re-deriving their CIDs writes (docs/spec.md section 9.4), as ``aggregate_meta``
is for a round/4 record's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..dag.cid import CID
from .record import aggregate_meta


def step_aggregate_meta(
    job: str, round_: int, step: str, method: str, inputs: Sequence[CID], *, run: str
) -> dict[str, Any]:
    """The meta of a step's aggregate: ``aggregate_meta``'s (its method and its inputs'
    CIDs, sorted by peer) and the step's name."""
    return {**aggregate_meta(job, round_, method, inputs, run=run), "step": step}


def model_meta(job: str, round_: int, steps: Sequence[str], *, run: str) -> dict[str, Any]:
    """The meta of a stepped round's model-level output: the names of the steps whose
    tensors it holds (the closed ones, in the round record's order)."""
    return {"kind": "aggregate", "job": job, "run": run, "round": round_, "steps": list(steps)}
