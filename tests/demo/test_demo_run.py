"""The demo trains through the real store, messages and coordinator, and trains correctly."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradstore.dag import DAG_CBOR
from gradstore.demo import (
    DemoConfig,
    digits_split,
    full_batch_losses,
    make_model,
    run_demo,
)
from gradstore.demo._run import _settle
from gradstore.errors import CoordinatorError
from gradstore.messages import SigningKey, decode_record
from gradstore.node import LocalNode

SEED = 7


async def _run(config, node, key=None):
    data = digits_split(config.peers, config.seed)
    return await run_demo(config, node, data, coordinator_key=key), data


def _reference_losses(config, data):
    model = make_model(config.model, data.n_features, data.n_classes)
    init = model.init(np.random.default_rng(config.seed))
    return full_batch_losses(model, init, data, steps=config.rounds, lr=config.learning_rate)


@pytest.mark.parametrize("model", ["softmax", "mlp"])
def test_data_parallel_equals_full_batch_gradient_descent(tmp_path, model):
    config = DemoConfig(peers=4, rounds=4, mode="data-parallel", model=model, seed=SEED)
    result, data = asyncio.run(_run(config, LocalNode(tmp_path / "node")))
    losses = [row.loss for row in result.rows]
    np.testing.assert_allclose(
        losses, _reference_losses(config, data), rtol=0, atol=1e-5, err_msg=f"seed={SEED}"
    )
    assert losses[-1] < losses[0]


def test_data_parallel_equals_full_batch_on_kubo(kubo):
    config = DemoConfig(peers=3, rounds=3, mode="data-parallel", seed=SEED)

    async def go():
        node = kubo.node()
        try:
            return await _run(config, node)
        finally:
            await node.aclose()

    result, data = asyncio.run(go())
    np.testing.assert_allclose(
        [r.loss for r in result.rows],
        _reference_losses(config, data),
        rtol=0,
        atol=1e-5,
        err_msg=f"seed={SEED}",
    )


@pytest.mark.slow
def test_federated_reaches_90_percent_held_out_accuracy_in_20_rounds(tmp_path):
    config = DemoConfig(peers=4, rounds=20, mode="federated", seed=SEED)
    result, _ = asyncio.run(_run(config, LocalNode(tmp_path / "node")))
    assert max(row.accuracy for row in result.rows) >= 0.90, [
        round(r.accuracy, 3) for r in result.rows
    ]
    assert result.rows[-1].accuracy >= 0.90


def test_every_round_leaves_a_signed_record_chained_to_the_previous(tmp_path):
    key = SigningKey.generate()
    node = LocalNode(tmp_path / "node")
    config = DemoConfig(peers=2, rounds=3, mode="federated", seed=SEED)
    result, _ = asyncio.run(_run(config, node, key))
    assert [r.round for r in result.rows] == [0, 1, 2]
    assert result.coordinator == key.did and result.head_record == result.rows[-1].record

    async def records():
        return [decode_record(await node.get_block(r.record), cid=r.record) for r in result.rows]

    recs = asyncio.run(records())
    assert [r.prev for r in recs] == [None, result.rows[0].record, result.rows[1].record]
    assert all(
        r.coordinator == key.did and r.method == "fedavg" and len(r.inputs) == 2 for r in recs
    )
    assert all(
        row.record.codec == DAG_CBOR and row.traffic_bytes > row.input_bytes > 0
        for row in result.rows
    )
    assert [r.output for r in recs] == [row.aggregate for row in result.rows]


def test_config_refuses_nonsense():
    with pytest.raises(ValueError, match="mode"):
        DemoConfig(mode="async")
    with pytest.raises(ValueError, match="peers"):
        DemoConfig(peers=0)
    with pytest.raises(ValueError, match="lr"):
        DemoConfig(lr=-1.0)
    assert DemoConfig(mode="data-parallel").learning_rate == 0.5
    assert DemoConfig(lr=0.01).learning_rate == 0.01


def test_a_failed_round_stops_the_demo_with_its_reason():
    async def go():
        loop = asyncio.get_running_loop()
        steps = loop.create_future()  # the peers never finish
        coordinator = asyncio.create_task(asyncio.sleep(30))
        failure = loop.create_future()
        loop.call_later(
            0.01, failure.set_exception, CoordinatorError("round 3 failed: quorum not met")
        )
        try:
            await _settle(steps, coordinator, failure, 3)
        finally:
            coordinator.cancel()
        return steps

    with pytest.raises(CoordinatorError, match="quorum not met"):
        asyncio.run(go())


def test_a_crashed_coordinator_stops_the_demo():
    async def go():
        loop = asyncio.get_running_loop()
        steps = loop.create_future()

        async def crash():
            raise RuntimeError("journal is gone")

        coordinator = asyncio.create_task(crash())
        failure = loop.create_future()
        await _settle(steps, coordinator, failure, 0)

    with pytest.raises(RuntimeError, match="journal is gone"):
        asyncio.run(go())
