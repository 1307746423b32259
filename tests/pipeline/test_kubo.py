"""The pipeline on real Kubo: a 2-stage x 2-replica run of the demo's MLP equals full-batch
gradient descent of the same model in one process; a micro-batch that never comes fails
the replica's round at the deadline with its reason, instead of hanging; an activation
document of the wrong shape or dtype fails it ``schema-mismatch``."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradstore.coordinator import Coordinator
from gradstore.demo import digits_split, full_batch_losses
from gradstore.demo._models import MLP
from gradstore.demo._pipeline import PipelineDemoConfig, run_pipeline_demo
from gradstore.errors import Reason
from gradstore.format import Gradient
from gradstore.peer import Peer
from gradstore.pipeline import FORWARD, StageMessage, encode_stage_message, pipeline_topic
from gradstore.pipeline.audit import ForwardAudit, reexecute_forward
from gradstore.pipeline.layers import mlp_stages
from gradstore.pipeline.runner import ACTIVATION, MicroBatchMissing, PipelineError, StageReplica
from gradstore.store import GradientStore

from .helpers import COORDINATOR, KEYS, job

SEED = 7


def test_two_stages_by_two_replicas_equal_full_batch_on_kubo(kubo) -> None:  # type: ignore[no-untyped-def]
    config = PipelineDemoConfig(replicas=2, rounds=3, micro_batches=4, seed=SEED)
    data = digits_split(2, SEED)

    audits: list[ForwardAudit] = []

    async def go():  # type: ignore[no-untyped-def]
        async with kubo.node() as node:
            result = await run_pipeline_demo(config, node, data)
            store = GradientStore(node)
            body = mlp_stages()[0]
            for info in result.last.values():
                if info.outputs:  # a body replica: re-execute every micro-batch's forward pass
                    assert info.params is not None
                    for mb, out in info.outputs.items():
                        audits.append(
                            await reexecute_forward(
                                store,
                                body,
                                input_cid=info.inputs[mb],
                                params_cid=info.params,
                                output_cid=out,
                            )
                        )
                    # other parameters (another micro-batch's input) give another document
                    other = await reexecute_forward(
                        store,
                        body,
                        input_cid=info.inputs[1],
                        params_cid=info.params,
                        output_cid=info.outputs[0],
                    )
                    assert not other.matches and other.max_abs_diff > 0
            return result

    result = asyncio.run(go())
    assert len(audits) == 8 and all(a.matches and a.max_abs_diff == 0.0 for a in audits)
    model = MLP(data.n_features, data.n_classes)
    init = model.init(np.random.default_rng(SEED))
    reference = full_batch_losses(model, init, data, steps=config.rounds, lr=config.lr)
    np.testing.assert_allclose(
        [r.loss for r in result.rows], reference, rtol=0, atol=1e-5, err_msg=f"seed={SEED}"
    )
    assert result.rows[-1].loss < result.rows[0].loss
    for info in result.last.values():
        # only the neighbours' re-sent messages of the round before, refused as stale
        assert {Reason.of(text) for text in info.refused} <= {Reason.STALE_ROUND}
        assert len(info.inputs) == 4 or len(info.outputs) == 4


def test_a_missing_micro_batch_fails_at_the_deadline_with_its_reason(kubo, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = job(deadline_s=1.5)
    head0 = KEYS[2]

    async def go() -> None:
        async with kubo.node() as node:
            stop = asyncio.Event()
            coordinator = Coordinator(config, COORDINATOR, node, tmp_path, linger_s=0.0)
            task = asyncio.create_task(coordinator.run(stop))
            try:
                await _head_alone(node)
            finally:
                stop.set()
                await asyncio.wait_for(task, 30.0)

    async def _head_alone(node) -> None:  # type: ignore[no-untyped-def]
        async with Peer(config, node, head0, first_backoff_s=0.5) as peer:
            replica = StageReplica(config, head0, node, peer, mlp_stages()[1])
            async with replica:
                # the coordinator runs, the body stage never sends: nothing arrives
                params = {
                    "fc2.weight": np.zeros((10, 64)),
                    "fc2.bias": np.zeros(10),
                }
                y = [np.zeros(3, dtype=np.int64)] * 4
                with pytest.raises(MicroBatchMissing) as err:
                    await asyncio.wait_for(
                        replica.train_round(0, params, y=y, rows=12, lr=0.1), 30.0
                    )
                assert err.value.code is Reason.ABSENT
                assert "micro-batches 0, 1, 2, 3 got no activations within 1.5s" in str(err.value)

    asyncio.run(go())


@pytest.mark.parametrize(
    ("value", "what"),
    [
        (np.zeros((3, 5)), "3 x 5 where the head takes 64 columns"),
        (np.zeros((3, 64), dtype=np.float32), "float32"),
        (np.zeros((2, 64)), "2 rows where the micro-batch has 3"),
    ],
)
def test_an_activation_document_of_the_wrong_shape_is_refused_schema_mismatch(  # type: ignore[no-untyped-def]
    kubo, tmp_path, value, what
) -> None:
    """A body replica's correctly signed message naming a document that is not one float64
    activation of the head's shape fails the head's round ``schema-mismatch``."""
    config = job(deadline_s=20.0)
    body0, head0 = KEYS[0], KEYS[2]

    async def go() -> None:
        async with kubo.node() as node:
            stop = asyncio.Event()
            coordinator = Coordinator(config, COORDINATOR, node, tmp_path, linger_s=0.0)
            task = asyncio.create_task(coordinator.run(stop))
            try:
                async with Peer(config, node, head0, first_backoff_s=0.5) as peer:
                    replica = StageReplica(config, head0, node, peer, mlp_stages()[1])
                    async with replica:
                        forger = asyncio.create_task(_send_bad(node, peer))
                        try:
                            await _head_round(replica)
                        finally:
                            forger.cancel()
            finally:
                stop.set()
                await asyncio.wait_for(task, 30.0)

    async def _send_bad(node, peer) -> None:  # type: ignore[no-untyped-def]
        while peer.run is None:
            await asyncio.sleep(0.05)
        cid = await GradientStore(node).put(Gradient({ACTIVATION: value}))
        msg = StageMessage(FORWARD, config.job, peer.run, 0, 0, "head", 0, body0.did, cid, 1)
        while True:  # pubsub may drop one: send it until the round fails
            await node.publish(pipeline_topic(config.job), encode_stage_message(msg, body0))
            await asyncio.sleep(0.3)

    async def _head_round(replica: StageReplica) -> None:
        params = {"fc2.weight": np.zeros((10, 64)), "fc2.bias": np.zeros(10)}
        y = [np.zeros(3, dtype=np.int64)] * 4
        with pytest.raises(PipelineError) as err:
            await asyncio.wait_for(replica.train_round(0, params, y=y, rows=12, lr=0.1), 30.0)
        assert err.value.code is Reason.SCHEMA_MISMATCH, what
        assert "micro-batch 0 from " + body0.did in str(err.value)

    asyncio.run(go())
