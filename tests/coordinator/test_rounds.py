"""Coordinator rounds on three real Kubo daemons: every method, stragglers, quorum failures."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import AggregationParams, Layout, aggregate, exact_combine, exact_partial
from gradstore.dag import file_cid
from gradstore.format import Gradient, encode
from gradstore.messages import decode_record
from gradstore.peer import Peer
from gradstore.store import GradientStore

from .harness import gradients, make_job, publish_all, start_coordinator, wait_subscribed, world

pytestmark = pytest.mark.kubo

METHOD_PARAMS: dict[str, dict[str, Any]] = {
    "sum": {},
    "mean": {},
    "fedavg": {},
    "weighted": {"weights": None},  # filled per job below
    "median": {},
    "trimmed_mean": {"trim_ratio": 0.25},
    "krum": {"byzantine": 0},
    "multikrum": {"byzantine": 0, "select": 2},
}


def _reference(
    method: str, grads: list[Gradient], samples: list[int], weights: list[float]
) -> dict[str, np.ndarray]:
    """Straightforward NumPy forms, float64, on the inputs in peer order."""
    out = {}
    if method in ("krum", "multikrum"):  # Blanchard et al. 2017 with f = 0, over all tensors
        flat = np.stack(
            [np.concatenate([np.ravel(g.tensors[n]) for n in sorted(g.tensors)]) for g in grads]
        )
        flat = flat.astype(np.float64)
        d = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(axis=2)
        k = len(grads) - 0 - 2
        scores = [np.sort(np.delete(d[i], i))[:k].sum() for i in range(len(grads))]
        chosen = np.argsort(scores, kind="stable")[: 1 if method == "krum" else 2]
        for name in grads[0].tensors:
            stack = np.stack([np.asarray(grads[i].tensors[name], dtype=np.float64) for i in chosen])
            out[name] = stack.mean(axis=0).astype(grads[0].tensors[name].dtype)
        return out
    for name in grads[0].tensors:
        x = np.stack([np.asarray(g.tensors[name], dtype=np.float64) for g in grads])
        if method == "sum":
            r = x.sum(axis=0)
        elif method == "mean":
            r = x.mean(axis=0)
        elif method == "fedavg":
            r = np.tensordot(np.array(samples, dtype=np.float64) / sum(samples), x, axes=1)
        elif method == "weighted":
            r = np.tensordot(np.array(weights) / sum(weights), x, axes=1)
        elif method == "median":
            r = np.median(x, axis=0)
        else:  # trimmed_mean, 0.25 of 4 inputs: one trimmed at each end
            r = np.sort(x, axis=0)[1:-1].mean(axis=0)
        out[name] = r.astype(grads[0].tensors[name].dtype)
    return out


@pytest.mark.parametrize("method", list(METHOD_PARAMS))
def test_four_peers_three_rounds(kubo_factory, tmp_path: Path, method: str) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    agg = dict(METHOD_PARAMS[method])
    if method == "weighted":
        _, _, keys = make_job(4)
        agg["weights"] = {k.did: float(i + 1) for i, k in enumerate(keys)}
    config, coord, peers = make_job(4, method=method, rounds=3, **agg)
    samples = [10, 20, 30, 40]

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            coordinator, task = start_coordinator(w, tmp_path / "state")
            await wait_subscribed(w)
            for r in range(3):
                grads = gradients(4, r)
                async with Peer(config, w.peer_nodes[0]) as listener:
                    await publish_all(w, r, grads, samples)
                    result = await listener.await_result(r, timeout=30)
                assert result.peers == tuple(k.did for k in peers)
                weights = [config.weights.get(k.did, 1.0) for k in peers]
                expected = _reference(method, grads, samples, weights)
                for name, ref in expected.items():
                    np.testing.assert_allclose(
                        result.gradient.tensors[name],
                        ref,
                        rtol=1e-5,
                        atol=1e-6,
                        err_msg=f"{method} round {r} tensor {name}",
                    )
                # anyone can recompute the round from its record and get the same output CID
                record = decode_record(
                    await w.peer_nodes[1].get_block(result.record), cid=result.record
                )
                assert record.round == r and record.output == result.cid
                inputs = [
                    await GradientStore(w.peer_nodes[1]).get(i.gradient) for i in record.inputs
                ]
                params = AggregationParams.from_record(record.method, record.params)
                again = aggregate(
                    [g.tensors for g in inputs], params, [i.num_samples for i in record.inputs]
                )
                meta = {
                    "kind": "aggregate",
                    "job": config.job,
                    "run": record.run,
                    "round": r,
                    "method": method,
                    "inputs": [str(i.gradient) for i in record.inputs],
                }
                assert file_cid(encode(Gradient(again, meta))) == result.cid
                assert (record.prev is None) == (r == 0)
            outcomes = await asyncio.wait_for(task, 30)
            assert [o.status for o in outcomes] == ["closed"] * 3
            assert [r for r in coordinator.refusals if r != "duplicate"] == []

    asyncio.run(go())


@pytest.mark.parametrize(
    ("method", "extra"),
    [("fedavg", {}), ("median", {"clip_input_norm": 500.0}), ("multikrum", {"byzantine": 1})],
)
def test_inputs_read_back_from_the_node_give_the_in_memory_aggregate(
    kubo_factory, tmp_path: Path, method: str, extra: dict[str, Any]
) -> None:  # type: ignore[no-untyped-def]
    # keep_bytes=0: no verified input stays in memory; the close reads each one back from
    # the coordinator's node, range by range (leaves verified), and must give the same bits
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(5, method=method, **extra)
    grads = gradients(5, 0, shape=(600, 700))  # 1.6 MiB each: two leaves, ranges cross them
    samples = [3, 1, 4, 1, 5]

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            _, task = start_coordinator(w, tmp_path, keep_bytes=0)
            await wait_subscribed(w)
            await publish_all(w, 0, grads, samples)
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "closed"
            record = decode_record(await w.coord_node.get_block(outcome.record), cid=outcome.record)
            inputs = [await GradientStore(w.coord_node).get(i.gradient) for i in record.inputs]
            params = AggregationParams.from_record(record.method, record.params)
            again = aggregate(
                [g.tensors for g in inputs], params, [i.num_samples for i in record.inputs]
            )
            meta = {
                "kind": "aggregate",
                "job": config.job,
                "run": record.run,
                "round": 0,
                "method": method,
                "inputs": [str(i.gradient) for i in record.inputs],
            }
            assert file_cid(encode(Gradient(again, meta))) == outcome.output

    asyncio.run(go())


def test_an_exact_round_is_the_sum_of_any_grouping(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``accumulate = "exact"`` on real daemons: the record names the mode, and the output
    is what any split of the inputs into partial sums gives (issue 22's tree)."""
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(4, method="fedavg", accumulate="exact")
    samples = [10, 20, 30, 40]

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            _, task = start_coordinator(w, tmp_path / "state")
            await wait_subscribed(w)
            grads = gradients(4, 0)
            async with Peer(config, w.peer_nodes[0]) as listener:
                await publish_all(w, 0, grads, samples)
                result = await listener.await_result(0, timeout=30)
            record = decode_record(
                await w.peer_nodes[1].get_block(result.record), cid=result.record
            )
            assert record.params == {"accumulate": "exact"}
            inputs = [await GradientStore(w.peer_nodes[1]).get(i.gradient) for i in record.inputs]
            tensors = [g.tensors for g in inputs]
            counts = [float(i.num_samples) for i in record.inputs]
            layout = Layout.of((name, a.dtype, a.shape) for name, a in tensors[0].items())
            for groups in ([[0, 1], [2, 3]], [[3], [0, 2], [1]]):
                partials = [
                    exact_partial([tensors[i] for i in g], layout, [counts[i] for i in g])
                    for g in groups
                ]
                tree = exact_combine(partials, layout, sum(counts))
                for name, array in result.gradient.tensors.items():
                    assert np.asarray(array).tobytes() == tree[name].tobytes(), (groups, name)
            outcomes = await asyncio.wait_for(task, 30)
            assert [o.status for o in outcomes] == ["closed"]

    asyncio.run(go())
