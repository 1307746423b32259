"""One lane of a 2-stage pipeline on a real Kubo daemon (body = fc1 with tanh, head = fc2 and
the loss), each replica a real ``StageReplica`` with its own peer, and the coordinator; a
forger (or a lying body layer) beside it. Small shapes, so a round takes a second."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from gradstore.coordinator import Coordinator
from gradstore.job import JobConfig, parse_job
from gradstore.node import KuboDaemon, Node
from gradstore.peer import Peer
from gradstore.pipeline import StageMessage, decode_stage_message, pipeline_topic
from gradstore.pipeline.layers import DenseStage, Params, mlp_stages
from gradstore.pipeline.runner import ReplicaRound, StageReplica, micro_batches
from gradstore.store import GradientStore

from .helpers import COORDINATOR, KEYS

BODY, HEAD = KEYS[0], KEYS[2]
M, ROWS, FEATURES, HIDDEN, CLASSES = 4, 12, 8, 5, 3
Forger = Callable[[Node, Peer, GradientStore], Awaitable[None]]


def lane_job(in_flight: int) -> JobConfig:
    """One lane: stage ``body`` (fc1) held by BODY, ``head`` (fc2) by HEAD."""
    return parse_job(lane_raw(in_flight))


def lane_raw(in_flight: int = M) -> dict[str, Any]:
    """``lane_job``'s table."""
    return {
        "job": "pipe-lane",
        "coordinator": COORDINATOR.did,
        "peers": [BODY.did, HEAD.did],
        "rounds": {"count": 1, "quorum": 2, "deadline_s": 30.0},
        "stages": [
            {"name": "body", "tensors": ["fc1.*"], "peers": [BODY.did]},
            {"name": "head", "tensors": ["fc2.*"], "peers": [HEAD.did]},
        ],
        "pipeline": {"micro_batches": M, "in_flight": in_flight, "deadline_s": 30.0},
    }


def data() -> tuple[Params, Params, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    body = {"fc1.weight": rng.normal(size=(HIDDEN, FEATURES)), "fc1.bias": rng.normal(size=HIDDEN)}
    head = {"fc2.weight": rng.normal(size=(CLASSES, HIDDEN)), "fc2.bias": rng.normal(size=CLASSES)}
    return body, head, rng.normal(size=(ROWS, FEATURES)), rng.integers(0, CLASSES, size=ROWS)


def honest_loss() -> float:
    """The lane's loss, computed in one process by the stages' own math."""
    body, head, x, y = data()
    fc1, fc2 = mlp_stages()
    xs, ys = micro_batches(x, M), micro_batches(y, M)
    return sum(fc2.loss_backward(head, fc1.forward(body, xs[i]), ys[i], ROWS)[0] for i in range(M))


async def _no_forger(node: Node, peer: Peer, store: GradientStore) -> None:
    return None


def run_lane(
    daemon: KuboDaemon,
    tmp: Path,
    config: JobConfig,
    forger: Forger = _no_forger,
    body_layer: DenseStage | None = None,
) -> tuple[ReplicaRound, ReplicaRound]:
    """Round 0 of the lane with ``forger`` running beside it (and ``body_layer`` as body's
    layer, default fc1 with tanh): body's and the head's rounds."""
    body, head, x, y = data()
    fc1, fc2 = mlp_stages()
    fc1 = body_layer or fc1

    async def go() -> tuple[ReplicaRound, ReplicaRound]:
        async with daemon.node() as node:
            stop = asyncio.Event()
            coordinator = Coordinator(config, COORDINATOR, node, tmp, linger_s=0.0)
            task = asyncio.create_task(coordinator.run(stop))
            try:
                async with (
                    Peer(config, node, BODY, first_backoff_s=0.5) as bpeer,
                    Peer(config, node, HEAD, first_backoff_s=0.5) as hpeer,
                    StageReplica(config, BODY, node, bpeer, fc1) as brep,
                    StageReplica(config, HEAD, node, hpeer, fc2) as hrep,
                ):
                    forged = asyncio.create_task(forger(node, bpeer, GradientStore(node)))
                    try:
                        rounds = await asyncio.wait_for(
                            asyncio.gather(
                                brep.train_round(0, body, x=micro_batches(x, M), rows=ROWS, lr=0.1),
                                hrep.train_round(0, head, y=micro_batches(y, M), rows=ROWS, lr=0.1),
                            ),
                            60.0,
                        )
                        await asyncio.wait_for(forged, 10.0)  # it did its part
                    finally:
                        forged.cancel()
                    return rounds[0][1], rounds[1][1]
            finally:
                stop.set()
                await asyncio.wait_for(task, 30.0)

    return asyncio.run(go())


async def first_message(node: Node, job: str, direction: str) -> StageMessage:
    """The first ``direction`` message on the job's topic, as sent."""
    async with node.subscribe(pipeline_topic(job)) as sub:
        while True:
            msg = decode_stage_message((await sub.get(timeout=30.0)).data)
            if msg.type == direction:
                return msg
