"""End to end (issue 19 part 6): peers publish steps with ``Peer`` to the real coordinator
on real Kubo, and a keyless peer hears each step's aggregate as that step closes, then the
round's model-level output and its round/5 record."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from gradstore.aggregate import aggregate
from gradstore.coordinator import Coordinator
from gradstore.dag import CID, file_cid
from gradstore.format import Gradient, encode
from gradstore.messages import decode_stepped_record, step_aggregate_meta
from gradstore.peer import AggregateResult, Peer, StepFailed

from ..coordinator.harness import World, wait_subscribed, world
from ..coordinator.steps_harness import step_gradients, stepped_job

pytestmark = pytest.mark.kubo


def _expected(w: World, run: str, step: str, sent: dict[int, dict[str, CID]],
              grads: list[Gradient], samples: list[int]) -> CID:  # fmt: skip
    """The CID of ``step``'s aggregate over the documents the peers in ``sent`` sent for it."""
    config = next(s for s in w.config.steps if s.name == step)
    order = sorted(sent, key=lambda i: w.peer_keys[i].did)
    tensors = [
        {n: grads[i].tensors[n] for n in grads[i].tensors if config.covers(n)} for i in order
    ]
    out = aggregate(tensors, config.params_for([w.peer_keys[i].did for i in order]),
                    [samples[i] for i in order])  # fmt: skip
    cids = [sent[i][step] for i in order]
    meta = step_aggregate_meta(w.config.job, 0, step, config.aggregation.method, cids, run=run)
    return file_cid(encode(Gradient(out, meta)))


def test_peers_publish_steps_and_hear_each_close_with_the_real_coordinator(  # type: ignore[no-untyped-def]
    kubo_factory, tmp_path: Path
) -> None:
    daemons = kubo_factory(3, connect=True)
    config, coord, keys = stepped_job(body={"deadline_s": 6.0})  # head: median of 3; body: quorum 2
    grads = [Gradient({**g["head"].tensors, **g["body"].tensors}) for g in step_gradients(3, 0)]
    samples = [5, 6, 7]

    async def go() -> dict[str, Any]:
        async with world(daemons, config, coord, keys) as w:
            coordinator = Coordinator(config, coord, w.coord_node, tmp_path / "state",
                                      rebroadcast_s=0.5, linger_s=0)  # fmt: skip
            stop = asyncio.Event()
            task = asyncio.create_task(coordinator.run(stop))
            try:
                await wait_subscribed(w)
                async with Peer(config, w.peer_nodes[0], coordinator_timeout_s=30) as listener:
                    got: list[tuple[float, AggregateResult | StepFailed]] = []

                    async def hear() -> None:
                        async for item in listener.step_results(0, timeout=60):
                            got.append((time.monotonic(), item))

                    hearing = asyncio.create_task(hear())
                    started = time.monotonic()
                    sent: dict[int, dict[str, CID]] = {}

                    async def publish(i: int) -> None:
                        async with Peer(config, w.peer_nodes[i], keys[i], listener=listener,
                                        first_backoff_s=0.5) as p:  # fmt: skip
                            if i < 2:  # every step of a whole gradient
                                sent[i] = await p.publish_steps(grads[i], 0, samples[i], timeout=60)
                            else:  # peer 2 sends head alone: body closes at its deadline
                                cid = await p.publish(
                                    grads[i], 0, samples[i], step="head", timeout=60
                                )
                                sent[i] = {"head": cid}

                    await asyncio.gather(*(publish(i) for i in range(3)))
                    await asyncio.wait_for(hearing, 60)
                    whole = await listener.await_result(0, timeout=30)
                    body = await listener.await_result(0, step="body", timeout=30)
                    record = decode_stepped_record(await w.coord_node.get_block(whole.record),
                                                   cid=whole.record)  # fmt: skip
                    run = coordinator.run_id
                    return {
                        "got": [(t - started, item) for t, item in got],
                        "whole": whole,
                        "body": body,
                        "record": record,
                        "head_cid": _expected(w, run, "head", sent, grads, samples),
                        "body_cid": _expected(
                            w, run, "body", {i: sent[i] for i in (0, 1)}, grads, samples
                        ),
                    }
            finally:
                stop.set()
                await asyncio.gather(task, return_exceptions=True)

    out = asyncio.run(go())
    (head_at, head), (body_at, body) = out["got"]
    # head closes once its three peers are in; body at its own deadline, with its quorum
    assert isinstance(head, AggregateResult) and isinstance(body, AggregateResult)
    assert (head.step, body.step) == ("head", "body")
    assert head_at < body_at and body_at >= 6.0, (head_at, body_at)
    assert head.cid == out["head_cid"] and body.cid == out["body_cid"]  # the step's own bits
    assert sorted(head.gradient.tensors) == ["fc.b", "fc.w"]
    assert head.peers == tuple(sorted(k.did for k in keys))
    assert out["body"].cid == body.cid and out["body"].peers == body.peers
    assert len(body.peers) == 2
    # the round: the model-level output holds every step's tensors, the round/5 links them
    whole, record = out["whole"], out["record"]
    assert whole.step is None and record.output == whole.cid
    assert [(s.step, s.output) for s in record.steps] == [("head", head.cid), ("body", body.cid)]
    for name, array in whole.gradient.tensors.items():
        part = head if name.startswith("fc.") else body
        assert array.tobytes() == part.gradient.tensors[name].tobytes()
    assert sorted(whole.gradient.tensors) == ["conv.w", "fc.b", "fc.w"]


def test_a_peer_that_missed_the_steps_results_gets_their_aggregates_from_the_round_record(  # type: ignore[no-untyped-def]
    kubo_factory, tmp_path: Path
) -> None:
    """The bounded beacon (issue 19): once the round's result is out the real coordinator no
    longer repeats its steps' results. A peer that begins to listen after that (it missed
    every step's result) still gets each step's aggregate, read through the round/5 record
    the round's result names, and a peer sending its input again hears it was aggregated."""
    daemons = kubo_factory(3, connect=True)
    config, coord, keys = stepped_job()
    grads = [Gradient({**g["head"].tensors, **g["body"].tensors}) for g in step_gradients(3, 0)]

    async def go() -> dict[str, Any]:
        async with world(daemons, config, coord, keys) as w:
            coordinator = Coordinator(config, coord, w.coord_node, tmp_path / "state",
                                      rebroadcast_s=0.5, linger_s=120)  # fmt: skip
            stop = asyncio.Event()
            task = asyncio.create_task(coordinator.run(stop))
            try:
                await wait_subscribed(w)
                sent: dict[int, dict[str, CID]] = {}

                async def publish(i: int) -> None:
                    async with Peer(config, w.peer_nodes[i], keys[i], first_backoff_s=0.5) as p:
                        sent[i] = await p.publish_steps(grads[i], 0, 5, timeout=60)

                await asyncio.gather(*(publish(i) for i in range(3)))
                deadline = time.monotonic() + 60
                while not coordinator.outcomes:
                    assert time.monotonic() < deadline, "the round never closed"
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.5)  # past any step result still in flight
                assert coordinator.state.step_results == {}  # no longer repeated
                async with Peer(config, w.peer_nodes[1], keys[1], first_backoff_s=0.5) as late:
                    head = await late.await_result(0, step="head", timeout=30)
                    items = [item async for item in late.step_results(0, timeout=30)]
                    again = await late.announce(sent[1]["body"], 0, 5, step="body", timeout=30)
                whole = coordinator.outcomes[0]
                record = decode_stepped_record(
                    await w.coord_node.get_block(whole.record), cid=whole.record
                )  # fmt: skip
                return {"head": head, "items": items, "again": again, "sent": sent,
                        "record": record}  # fmt: skip
            finally:
                stop.set()
                await asyncio.gather(task, return_exceptions=True)

    out = asyncio.run(go())
    record = out["record"]
    outputs = {s.step: (s.output, s.record) for s in record.steps}
    head, items = out["head"], out["items"]
    assert isinstance(head, AggregateResult) and (head.cid, head.record) == outputs["head"]
    assert head.peers == tuple(sorted(k.did for k in keys))
    assert sorted(head.gradient.tensors) == ["fc.b", "fc.w"]
    assert [getattr(i, "step", None) for i in items] == ["head", "body"]  # the job's order
    for item in items:
        assert isinstance(item, AggregateResult) and (item.cid, item.record) == outputs[item.step]
    assert out["again"] == out["sent"][1]["body"]  # verified: the record says it was aggregated
