"""A replica's refusals of messages that pass every check of their own but not the round's
state, on real Kubo: a second, other CID for a micro-batch it already took
(``conflicting-cid``), and a gradient for a micro-batch it has not sent forward
(``out-of-range``). Each is refused and the round goes on to the honest result: a lane of
two real replicas (body, head) whose head's loss is the one the stages' math gives in one
process. The forged messages are signed by the lane's real neighbour, so only the replica's
own bookkeeping catches them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from gradstore.dag.cid import CID
from gradstore.errors import Reason
from gradstore.format import Gradient
from gradstore.node import KuboDaemon, Node
from gradstore.peer import Peer
from gradstore.pipeline import BACKWARD, FORWARD, StageMessage, encode_stage_message, pipeline_topic
from gradstore.pipeline.runner import ACTIVATION, micro_batches
from gradstore.store import GradientStore

from .lane import BODY, HEAD, HIDDEN, M, data, first_message, honest_loss, lane_job, run_lane


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
