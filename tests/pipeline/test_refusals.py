"""A replica's refusals of messages that pass every check of their own but not the round's
state, on real Kubo: a second, other CID for a micro-batch it already took
(``conflicting-cid``), and a gradient for a micro-batch it has not sent forward
(``out-of-range``). Each is refused and the round goes on to the honest result: a lane of
two real replicas (body, head) whose head's loss is the one the stages' math gives in one
process. The forged messages are signed by the lane's real neighbour, so only the replica's
own bookkeeping catches them."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from gradstore.coordinator import Coordinator
from gradstore.dag.cid import CID
from gradstore.errors import Reason
from gradstore.format import Gradient
from gradstore.job import JobConfig, parse_job
from gradstore.node import KuboDaemon, Node
from gradstore.peer import Peer
from gradstore.pipeline import (
    BACKWARD,
    FORWARD,
    StageMessage,
    decode_stage_message,
    encode_stage_message,
    pipeline_topic,
)
from gradstore.pipeline.layers import Params, mlp_stages
from gradstore.pipeline.runner import ACTIVATION, ReplicaRound, StageReplica, micro_batches
from gradstore.store import GradientStore

from .helpers import COORDINATOR, KEYS

BODY, HEAD = KEYS[0], KEYS[2]
M, ROWS, FEATURES, HIDDEN, CLASSES = 4, 12, 8, 5, 3
Forger = Callable[[Node, Peer, GradientStore], Awaitable[None]]


def lane_job(in_flight: int) -> JobConfig:
    """One lane: stage ``body`` (fc1) held by BODY, ``head`` (fc2) by HEAD."""
    return parse_job(
        {
            "job": "pipe-refusals",
            "coordinator": COORDINATOR.did,
            "peers": [BODY.did, HEAD.did],
            "rounds": {"count": 1, "quorum": 2, "deadline_s": 30.0},
            "stages": [
                {"name": "body", "tensors": ["fc1.*"], "peers": [BODY.did]},
                {"name": "head", "tensors": ["fc2.*"], "peers": [HEAD.did]},
            ],
            "pipeline": {"micro_batches": M, "in_flight": in_flight, "deadline_s": 30.0},
        }
    )


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


def run_lane(
    daemon: KuboDaemon, tmp: Path, config: JobConfig, forger: Forger
) -> tuple[ReplicaRound, ReplicaRound]:
    """Round 0 of the lane with ``forger`` running beside it: body's and the head's rounds."""
    body, head, x, y = data()
    fc1, fc2 = mlp_stages()

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


def sign(msg: StageMessage, cid: CID) -> bytes:
    """``msg`` naming ``cid`` instead, signed by its sender (BODY or HEAD)."""
    key = BODY if msg.sender == BODY.did else HEAD
    return encode_stage_message(dataclasses.replace(msg, cid=cid), key)


@pytest.mark.slow
def test_a_second_cid_for_a_taken_micro_batch_is_refused_conflicting_cid(
    kubo: KuboDaemon, tmp_path: Path
) -> None:
    """Once the head took body's activation of micro-batch 0, another document for it, as
    correctly signed by body, is refused and changes nothing (without the check, the head
    computes micro-batch 0 again from the forged rows, and its loss is not the honest one)."""
    config = lane_job(in_flight=M)
    forged_cid: list[CID] = []

    async def forger(node: Node, peer: Peer, store: GradientStore) -> None:
        real = await first_message(node, config.job, FORWARD)
        rows = len(micro_batches(data()[2], M)[real.micro_batch])
        other = await store.put(Gradient({ACTIVATION: np.zeros((rows, HIDDEN))}))
        forged_cid.append(other)
        await node.publish(pipeline_topic(config.job), sign(real, other))

    _, head = run_lane(kubo, tmp_path, config, forger)
    conflicts = [r for r in head.refused if Reason.of(r) is Reason.CONFLICTING_CID]
    assert len(conflicts) == 1, head.refused
    assert f"now {forged_cid[0]}" in conflicts[0]
    assert head.loss == pytest.approx(honest_loss(), rel=0, abs=1e-12)


@pytest.mark.slow
def test_a_gradient_for_an_unsent_micro_batch_is_refused_out_of_range(
    kubo: KuboDaemon, tmp_path: Path
) -> None:
    """With one micro-batch in flight, body has sent only micro-batch 0 when a gradient for
    micro-batch 3, correctly signed by the head, comes: it is refused, and the real one is
    taken when it comes (without the check, body has no activation of 3 to take it
    against, and its round dies of a KeyError)."""
    config = lane_job(in_flight=1)

    async def forger(node: Node, peer: Peer, store: GradientStore) -> None:
        real = await first_message(node, config.job, FORWARD)  # body's micro-batch 0
        grad = await store.put(Gradient({ACTIVATION: np.ones((3, HIDDEN))}))
        early = StageMessage(
            BACKWARD, config.job, real.run, 0, M - 1, "body", 0, HEAD.did, grad, real.sent_at
        )
        await node.publish(pipeline_topic(config.job), encode_stage_message(early, HEAD))

    body, head = run_lane(kubo, tmp_path, config, forger)
    unsent = [r for r in body.refused if Reason.of(r) is Reason.OUT_OF_RANGE]
    assert unsent == [f"out-of-range: a gradient for unsent micro-batch {M - 1}"], body.refused
    assert head.loss == pytest.approx(honest_loss(), rel=0, abs=1e-12)
