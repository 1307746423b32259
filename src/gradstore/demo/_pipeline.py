"""``gradstore demo --mode model-parallel``: the demo's MLP cut into two stages (``fc1`` with
tanh, then ``fc2`` and the loss), each held by ``replicas`` peers. Lane ``r`` (replica ``r``
of each stage) trains on shard ``r``, cut into micro-batches that flow between the stages as
documents announced by signed messages; each stage's gradients are a step of the round that
the coordinator aggregates over the stage's replicas, and every replica applies its step.
With equal shards each round is one full-batch gradient-descent step of the whole model.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..coordinator import Coordinator, RoundOutcome
from ..dag.cid import CID
from ..errors import CoordinatorError
from ..job import JobConfig, parse_job
from ..messages import SigningKey
from ..node import Node
from ..peer import Peer
from ..pipeline.layers import mlp_stages
from ..pipeline.runner import ReplicaRound, StageReplica, micro_batches
from ._data import DigitsSplit
from ._models import MLP, Params, accuracy

STAGES = ("body", "head")  # fc1 (input stage), fc2 (output stage)


@dataclass(frozen=True)
class PipelineDemoConfig:
    """What the model-parallel demo trains: ``replicas`` lanes of two stages."""

    replicas: int = 2
    rounds: int = 20
    micro_batches: int = 4
    in_flight: int | None = None  # default: every micro-batch
    seed: int = 0
    lr: float = 0.5
    hidden: int | None = None
    deadline_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("replicas", "rounds", "micro_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.in_flight is not None and not 1 <= self.in_flight <= self.micro_batches:
            raise ValueError(f"in_flight must be 1..{self.micro_batches}, got {self.in_flight}")


@dataclass(frozen=True)
class PipelineRow:
    """One round: the whole model's training loss and held-out accuracy after it, the
    seconds it took and the stages' bubble (seconds replicas waited on a neighbour, summed
    and as a fraction of their summed wall time)."""

    round: int
    loss: float
    accuracy: float
    seconds: float
    bubble_s: float
    bubble_fraction: float
    samples: int
    #: Seconds of the micro-batch phase: the slowest replica's, before the steps aggregate.
    phase_s: float = 0.0


@dataclass
class PipelineDemoResult:
    """Every round, and each replica's last round (its CIDs, for audit)."""

    config: PipelineDemoConfig
    job: str
    rows: list[PipelineRow] = field(default_factory=list)
    last: dict[str, ReplicaRound] = field(default_factory=dict)  # did -> its last round
    params: Params = field(default_factory=dict)
    head: CID | None = None  # the last round's record
    coordinator: str = ""  # its did

    @property
    def bubble_s(self) -> float:
        """Seconds the replicas waited on a neighbour, summed over every round."""
        return sum(r.bubble_s for r in self.rows)

    @property
    def bubble_fraction(self) -> float:
        """The bubble as a fraction of the replicas' summed micro-batch time, every round."""
        wall = sum(r.bubble_s / r.bubble_fraction for r in self.rows if r.bubble_fraction > 0)
        return self.bubble_s / wall if wall > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Training samples through the pipeline per second, over every round."""
        return sum(r.samples for r in self.rows) / sum(r.seconds for r in self.rows)


def pipeline_job(
    job: str,
    coordinator: SigningKey,
    body: list[SigningKey],
    head: list[SigningKey],
    config: PipelineDemoConfig,
    schema: Params,
) -> JobConfig:
    """The in-memory pipeline job: two stages, fedavg over each stage's replicas."""
    raw: dict[str, Any] = {
        "job": job,
        "coordinator": coordinator.did,
        "peers": [k.did for k in body + head],
        "rounds": {
            "count": config.rounds,
            "quorum": len(body) + len(head),
            "deadline_s": config.deadline_s,
        },
        "schema": [
            {"name": n, "dtype": a.dtype.str, "shape": list(a.shape)} for n, a in schema.items()
        ],
        "stages": [
            {"name": STAGES[0], "tensors": ["fc1.*"], "peers": [k.did for k in body]},
            {"name": STAGES[1], "tensors": ["fc2.*"], "peers": [k.did for k in head]},
        ],
        "pipeline": {
            "micro_batches": config.micro_batches,
            "in_flight": config.in_flight or config.micro_batches,
            "deadline_s": config.deadline_s,
        },
    }
    return parse_job(raw, source="model-parallel demo job")


async def run_pipeline_demo(
    config: PipelineDemoConfig,
    node: Node,
    data: DigitsSplit,
    *,
    on_round: Callable[[PipelineRow], None] | None = None,
    on_replicas: Callable[[list[ReplicaRound]], None] | None = None,
    coordinator_key: SigningKey | None = None,
) -> PipelineDemoResult:
    """Train the MLP for ``config.rounds`` rounds over ``node`` (``data``: one shard per
    replica); ``on_round`` sees each finished round, ``on_replicas`` each round's replicas'
    accounts (where their time went); ``coordinator_key`` signs the round records."""
    if len(data.shards) != config.replicas:
        raise ValueError(f"{len(data.shards)} shards for {config.replicas} replicas")
    model = (
        MLP(data.n_features, data.n_classes)
        if config.hidden is None
        else MLP(data.n_features, data.n_classes, config.hidden)
    )
    initial = model.init(np.random.default_rng(config.seed))
    ckey = coordinator_key or SigningKey.generate()
    body = [SigningKey.generate() for _ in range(config.replicas)]
    head = [SigningKey.generate() for _ in range(config.replicas)]
    job = pipeline_job(f"pipe-{secrets.token_hex(4)}", ckey, body, head, config, initial)
    result = PipelineDemoResult(config, job.job, coordinator=ckey.did)
    with tempfile.TemporaryDirectory(prefix="gradstore-pipeline-state-") as state:
        await _train(
            config, model, data, job, ckey, body, head, node, Path(state), result, initial,
            on_replicas,
        )  # fmt: skip
    if on_round is not None:
        for row in result.rows:
            on_round(row)
    return result


async def _train(
    config: PipelineDemoConfig,
    model: MLP,
    data: DigitsSplit,
    job: JobConfig,
    ckey: SigningKey,
    body: list[SigningKey],
    head: list[SigningKey],
    node: Node,
    state: Path,
    result: PipelineDemoResult,
    initial: Params,
    on_replicas: Callable[[list[ReplicaRound]], None] | None,
) -> None:
    failure: list[str] = []

    def outcome(o: RoundOutcome) -> None:
        if o.status != "closed":
            failure.append(f"round {o.round} failed: {o.reason}")

    coordinator = Coordinator(job, ckey, node, state, linger_s=0.0, on_round=outcome)
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop), name="pipeline-coordinator")
    layers = mlp_stages()
    m = config.micro_batches
    try:
        async with contextlib.AsyncExitStack() as stack:
            replicas: list[tuple[StageReplica, int]] = []
            for lane, (bk, hk) in enumerate(zip(body, head, strict=True)):
                for k, layer in ((bk, layers[0]), (hk, layers[1])):
                    peer = await stack.enter_async_context(Peer(job, node, k, first_backoff_s=0.5))
                    rep = StageReplica(job, k, node, peer, layer)
                    replicas.append((await stack.enter_async_context(rep), lane))
            params = {
                k.did: {n: a.copy() for n, a in initial.items() if n.startswith(layer.layer)}
                for ks, layer in ((body, layers[0]), (head, layers[1]))
                for k in ks
            }
            for r in range(config.rounds):
                start = time.perf_counter()
                rounds = [
                    rep.train_round(
                        r,
                        params[rep.key.did],
                        x=micro_batches(data.shards[lane].x, m) if rep.first else None,
                        y=micro_batches(data.shards[lane].y, m) if rep.last else None,
                        rows=len(data.shards[lane]),
                        lr=config.lr,
                    )
                    for rep, lane in replicas
                ]
                done = await asyncio.gather(*rounds)
                seconds = time.perf_counter() - start
                if failure:
                    raise CoordinatorError(failure[0])
                for (rep, _), (new, info) in zip(replicas, done, strict=True):
                    params[rep.key.did] = new
                    result.last[rep.key.did] = info
                whole = {**params[body[0].did], **params[head[0].did]}
                for k in body + head:
                    if any(not np.array_equal(params[k.did][n], whole[n]) for n in params[k.did]):
                        raise CoordinatorError(f"round {r}: replicas hold different parameters")
                if on_replicas is not None:
                    on_replicas([info for _, info in done])
                bubble = sum(info.bubble_s for _, info in done)
                wall = sum(info.wall_s for _, info in done)
                row = PipelineRow(
                    round=r,
                    loss=model.loss(whole, data.x_train, data.y_train),
                    accuracy=accuracy(model, whole, data.x_test, data.y_test),
                    seconds=seconds,
                    bubble_s=bubble,
                    bubble_fraction=bubble / wall if wall > 0 else 0.0,
                    samples=sum(len(s) for s in data.shards),
                    phase_s=max(info.wall_s for _, info in done),
                )
                result.rows.append(row)
                result.params = whole
                result.head = coordinator.head
    finally:
        stop.set()
        finished, _ = await asyncio.wait({task}, timeout=30.0)
        if not finished:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
