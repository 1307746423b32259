"""A job's pipeline (``[[stages]]`` and ``[pipeline]``): model-parallel training, the model's
layers split into stages, each stage a step of the round aggregated over its own replicas.

[[stages]]      input layer first (a forward pass): name, tensors (a step's selectors), peers
                (the stage's replicas, default: none, required). Every stage has the same
                number of replicas; replica ``r`` of a stage sends its activations to replica
                ``r`` of the next one (a lane). A peer holds at most one stage. Each stage is
                the step of the same name (``[[steps]]`` is then written by the stages, in
                backward order, and may not be given as well).
[pipeline]      micro_batches (per replica and round, >= 1, default 1), in_flight (micro-batches
                the first stage has on the way at once, >= 1, default micro_batches),
                deadline_s (for every activation of a round, default rounds.deadline_s)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._aggregation import Where

_PIPELINE_KEYS = {"micro_batches", "in_flight", "deadline_s"}


@dataclass(frozen=True)
class StageConfig:
    """One stage: its name (= its step's), tensor selectors and replicas (peers, in lane
    order)."""

    name: str
    tensors: tuple[str, ...]
    replicas: tuple[str, ...]


@dataclass(frozen=True)
class PipelineConfig:
    """The stages, input stage first, and how a round's micro-batches flow."""

    stages: tuple[StageConfig, ...]
    micro_batches: int
    in_flight: int
    deadline_s: float

    @property
    def width(self) -> int:
        """Replicas per stage (lanes)."""
        return len(self.stages[0].replicas)

    def index(self, name: str) -> int:
        """The position of stage ``name`` (KeyError for none)."""
        for i, stage in enumerate(self.stages):
            if stage.name == name:
                return i
        raise KeyError(name)

    def place(self, did: str) -> tuple[int, int] | None:
        """(stage index, replica index) of peer ``did``, or None if it holds no stage."""
        for i, stage in enumerate(self.stages):
            if did in stage.replicas:
                return i, stage.replicas.index(did)
        return None


def stages_as_steps(raw: Any, where: Where) -> list[dict[str, Any]]:
    """The ``[[steps]]`` tables the ``[[stages]]`` stand for, output stage first (a backward
    pass); the step parser then checks names, selectors, peers and aggregation."""
    if not isinstance(raw, list) or not raw:
        raise where.err("stages", "must be a non-empty list of tables ([[stages]])")
    if len(raw) < 2:
        raise where.err("stages", "lists one stage: a pipeline needs at least two")
    for i, table in enumerate(raw):
        if not isinstance(table, dict):
            raise where.err(f"stages[{i}]", "must be a table")
        if "peers" not in table:
            raise where.err(f"stages[{i}].peers", "is required (the stage's replicas)")
    return [dict(t) for t in reversed(raw)]


def parse_pipeline(
    stages_raw: list[dict[str, Any]], raw: Any, where: Where, *, deadline_s: float
) -> PipelineConfig:
    """Check what only a pipeline asks of its stages (equal replicas, a peer in one stage)
    and read ``[pipeline]``; every problem is a ConfigError naming the key."""
    stages = tuple(
        StageConfig(t["name"], tuple(t["tensors"]), tuple(t["peers"])) for t in stages_raw
    )
    width = len(stages[0].replicas)
    seen: dict[str, int] = {}
    for i, stage in enumerate(stages):
        if len(stage.replicas) != width:
            raise where.err(
                f"stages[{i}].peers",
                f"lists {len(stage.replicas)} replicas; stages[0] has {width} (one per lane)",
            )
        for did in stage.replicas:
            if did in seen:
                raise where.err(
                    f"stages[{i}].peers", f"{did[:24]}... holds stages[{seen[did]}] already"
                )
            seen[did] = i
    p = "pipeline."
    where.keys(raw, _PIPELINE_KEYS, p)
    micro = where.int_(raw.get("micro_batches", 1), p + "micro_batches", 1)
    in_flight = where.int_(raw.get("in_flight", micro), p + "in_flight", 1)
    if in_flight > micro:
        raise where.err(p + "in_flight", f"{in_flight} is more than the {micro} micro-batches")
    return PipelineConfig(
        stages=stages,
        micro_batches=micro,
        in_flight=in_flight,
        deadline_s=where.num(raw.get("deadline_s", deadline_s), p + "deadline_s", positive=True),
    )
