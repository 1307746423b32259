"""A stepped job on real Kubo (issue 19): each step closes, aggregates and publishes on its
own, with its own method; the round ends with a round/5 record and the model-level output;
refusals of a step's announcements reach the peer in that step's status."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gradstore.aggregate import aggregate
from gradstore.coordinator import Coordinator, format_outcome
from gradstore.dag import CID, file_cid
from gradstore.format import Gradient, encode
from gradstore.messages import (
    decode_step_record,
    decode_stepped_record,
    model_meta,
    step_aggregate_meta,
)
from gradstore.node import KuboNode
from gradstore.store import GradientStore

from .harness import World, wait_subscribed, world
from .steps_harness import announce, listening, run_id, step_gradients, stepped_job

pytestmark = pytest.mark.kubo


def _start(w: World, state: Path, stop: asyncio.Event) -> tuple[Coordinator, asyncio.Task[Any]]:
    coordinator = Coordinator(
        w.config, w.coord_key, w.coord_node, state, rebroadcast_s=0.5, linger_s=0
    )
    return coordinator, asyncio.create_task(coordinator.run(stop))


def expected_output(
    w: World,
    run: str,
    step: str,
    peers: list[int],
    grads: list[dict[str, Gradient]],
    samples: list[int],
) -> str:
    """The CID of ``step``'s aggregate over ``peers``' documents of it, computed here alone."""
    cfg = w.config
    config = next(s for s in cfg.steps if s.name == step)
    order = sorted(peers, key=lambda i: w.peer_keys[i].did)
    dids = [w.peer_keys[i].did for i in order]
    out = aggregate(
        [grads[i][step].tensors for i in order],
        config.params_for(dids),
        [samples[i] for i in order],
    )
    cids = [file_cid(encode(grads[i][step])) for i in order]
    meta = step_aggregate_meta(cfg.job, 0, step, config.aggregation.method, cids, run=run)
    return str(file_cid(encode(Gradient(out, meta))))


def test_a_step_closes_and_publishes_while_another_waits_then_closes_at_its_deadline(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = stepped_job(body={"deadline_s": 8.0})
    grads = step_gradients(3, 0)
    samples = [5, 6, 7]

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            stop = asyncio.Event()
            read = reads_of(w.coord_node)
            put = puts_of(w.coord_node)
            coordinator, task = _start(w, tmp_path / "state", stop)
            try:
                await wait_subscribed(w)
                async with listening(w, w.peer_nodes[0]) as heard:
                    run = await run_id(coordinator)
                    started = time.monotonic()
                    for i in range(3):
                        await announce(w, heard, i, 0, "head", grads[i]["head"], samples[i], run)
                    for i in range(2):  # peer 2's body never comes
                        await announce(w, heard, i, 0, "body", grads[i]["body"], samples[i], run)
                    head = await heard.result(0, "head")
                    head_at = time.monotonic() - started
                    # head closed and published while body still waits on peer 2
                    assert head_at < 8.0, head_at
                    assert heard.results(0, "body") == [] and heard.results(0, None) == []
                    assert (0, "body") not in coordinator.state.done
                    stats = coordinator.stats()
                    assert stats["steps"] == {"total": 2, "completed": 1, "pending": 1, "failed": 0}
                    assert stats["peers"] == 3
                    progress = coordinator.progress()
                    assert progress is not None and progress.steps_pending == 1
                    assert "steps 1/2 closed; 3 peers" in progress.line()
                    body = await heard.result(0, "body")
                    assert time.monotonic() - started >= 8.0  # at its own deadline
                    whole = await heard.result(0, None)
                await asyncio.wait_for(task, 30)
            finally:
                stop.set()
                await asyncio.gather(task, return_exceptions=True)
            # the model-level output took the steps' outputs from memory, not from the node
            assert not {head.cid, body.cid} & {str(c) for c in read}, read
            # each step's record went in its aggregate's import, not a block/put of its own
            assert not {head.record, body.record} & {str(c) for c in put}, put

            # each step has the bits of its own method over its tensors alone
            assert head.cid == expected_output(w, run, "head", [0, 1, 2], grads, samples)
            assert body.cid == expected_output(w, run, "body", [0, 1], grads, samples)
            assert (head.method, body.method, whole.method) == ("median", "fedavg", "median+fedavg")
            get = w.coord_node.get_block
            head_rec = decode_step_record(
                await get(CID.parse(head.record)), cid=CID.parse(head.record)
            )
            body_rec = decode_step_record(
                await get(CID.parse(body.record)), cid=CID.parse(body.record)
            )
            assert (head_rec.step, head_rec.tensors, len(head_rec.inputs)) == ("head", ("fc.*",), 3)
            assert [(e.peer, e.reason) for e in body_rec.excluded] == [
                (w.peer_keys[2].did, "absent: never announced")
            ]
            # the round/5 record links both steps; its output holds every step's tensors
            rnd = decode_stepped_record(
                await get(CID.parse(whole.record)), cid=CID.parse(whole.record)
            )
            assert [(s.step, str(s.record), str(s.output)) for s in rnd.steps] == [
                ("head", head.record, head.cid),
                ("body", body.record, body.cid),
            ]
            assert rnd.prev is None and str(rnd.output) == whole.cid
            store = GradientStore(w.coord_node)
            model = await store.get(whole.cid)
            parts = {**(await store.get(head.cid)).tensors, **(await store.get(body.cid)).tensors}
            assert sorted(model.tensors) == sorted(parts) == ["conv.w", "fc.b", "fc.w"]
            for name, array in parts.items():
                assert model.tensors[name].tobytes() == array.tobytes()
            outputs = [CID.parse(head.cid), CID.parse(body.cid)]
            assert model.meta == model_meta(config.job, 0, ["head", "body"], outputs, run=run)
            (outcome,) = coordinator.outcomes
            assert outcome.status == "closed" and str(outcome.record) == whole.record
            assert outcome.stats["steps"] == {"total": 2, "completed": 2, "failed": 0, "pending": 0}
            assert outcome.stats["peers"] == 3
            assert format_outcome(outcome).startswith(
                "round 0 closed: 2/2 steps closed, 0 failed, 3 peers, model output"
            )
            assert [(s.step, s.status) for s in outcome.steps] == [
                ("head", "closed"),
                ("body", "closed"),
            ]

        # gradstore round show: every step, and the counts of steps and peers
        show = [sys.executable, "-m", "gradstore", "round", "show", whole.record]
        show += ["--api", daemons[0].api_url, "--state", str(tmp_path / "state")]
        out = await asyncio.to_thread(subprocess.run, show, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["type"] == "gradstore/round/5" and doc["output"] == whole.cid
        assert [(s["step"], s["status"], s["method"]) for s in doc["steps"]] == [
            ("head", "closed", "median"),
            ("body", "closed", "fedavg"),
        ]
        assert doc["steps"][1]["counts"] == {
            "expected": 3,
            "aggregated": 2,
            "absent": 1,
            "failed": 0,
        }
        assert doc["counts"] == {
            "steps": {"total": 2, "completed": 2, "pending": 0, "failed": 0},
            "peers": 3,
            "aggregated": 3,
        }
        assert doc["stats"]["steps"]["completed"] == 2 and doc["stats"]["peers"] == 3
        assert doc["stats"]["by_step"]["body"]["verified"] == 2
        # and the audit re-derives every step and the model-level output from the records
        code, report = await audit(daemons[0].api_url, whole.record, coord.did)
        assert code == 0 and "model-level output" in report, report

    asyncio.run(go())


def reads_of(node: KuboNode) -> list[CID]:
    """Every block ``node`` is asked for from now on (its ``get_block`` wrapped)."""
    read: list[CID] = []
    get_block = node.get_block

    async def recorded(cid: CID, *args: Any, **kwargs: Any) -> bytes:
        read.append(cid)
        return await get_block(cid, *args, **kwargs)

    node.get_block = recorded  # type: ignore[method-assign]
    return read


def puts_of(node: KuboNode) -> list[CID]:
    """Every block ``node`` stores by ``put_block`` from now on (wrapped)."""
    put: list[CID] = []
    put_block = node.put_block

    async def recorded(*args: Any, **kwargs: Any) -> CID:
        cid = await put_block(*args, **kwargs)
        put.append(cid)
        return cid

    node.put_block = recorded  # type: ignore[method-assign]
    return put


async def audit(api: str, record: str, coordinator: str) -> tuple[int, str]:
    """``gradstore audit round`` of ``record`` (its exit code and output)."""
    cmd = [sys.executable, "-m", "gradstore", "audit", "round", record]
    cmd += ["--api", api, "--coordinator", coordinator]
    out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True)
    return out.returncode, out.stdout + out.stderr


def test_each_step_refusal_reaches_the_peer_in_that_steps_status(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    head_peers = [k.did for k in stepped_job()[2][:2]]
    config, coord, peers = stepped_job(head={"method": "mean", "peers": head_peers, "quorum": 2})
    grads = step_gradients(3, 0)

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            stop = asyncio.Event()
            coordinator, task = _start(w, tmp_path / "state", stop)
            try:
                await wait_subscribed(w)
                async with listening(w, w.peer_nodes[0]) as heard:
                    run = await run_id(coordinator)
                    dids = [k.did for k in peers]

                    async def refused(i: int, step: str | None, doc: Gradient) -> str:
                        await announce(w, heard, i, 0, step, doc, 1, run, until_received=False)
                        reason: str = await heard.until(lambda: heard.refusal(0, step, dids[i]))
                        return reason

                    # peer 2 is not one of head's peers
                    reason = await refused(2, "head", grads[2]["head"])
                    assert reason.startswith("not-in-step: ")
                    # the job has no step "tail": told in the status of the step it named
                    reason = await refused(0, "tail", grads[0]["head"])
                    assert reason.startswith("unknown-step: names step 'tail'")
                    # a body announcement of head's tensors: refused once fetched
                    reason = await refused(1, "body", grads[1]["head"])
                    assert reason.startswith("schema-mismatch: tensor 'fc.b' is not one of step")
                    assert coordinator.refusals["not-in-step"] == 1
                    assert coordinator.refusals["unknown-step"] == 1
            finally:
                stop.set()
                await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())


def test_a_failed_step_is_failed_in_round5_and_a_round_of_failed_steps_fails(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = stepped_job(rounds=2, deadline_s=3.0)
    grads = step_gradients(3, 0)

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            stop = asyncio.Event()
            coordinator, task = _start(w, tmp_path / "state", stop)
            try:
                await wait_subscribed(w)
                async with listening(w, w.peer_nodes[0]) as heard:
                    run = await run_id(coordinator)
                    for i in range(3):
                        await announce(w, heard, i, 0, "head", grads[i]["head"], 1, run)
                    await announce(w, heard, 0, 0, "body", grads[0]["body"], 1, run)
                    whole = await heard.result(0, None)
                    failed = [s.failed for s in heard.statuses(0, "body") if s.failed]
                    assert failed and failed[0] == "quorum not met: 1 verified of 2 needed"
                    # round 1: one peer's head only; both steps miss their quorum
                    await announce(w, heard, 0, 1, "head", grads[0]["head"], 1, run)
                    down = await heard.until(
                        lambda: [s for s in heard.statuses(1, None) if s.failed], timeout=30
                    )
                    assert down[0].failed.startswith("every step failed: head: quorum not met")
                await asyncio.wait_for(task, 30)
            finally:
                stop.set()
                await asyncio.gather(task, return_exceptions=True)
            rnd = decode_stepped_record(
                await w.coord_node.get_block(CID.parse(whole.record)), cid=CID.parse(whole.record)
            )
            assert [(s.step, s.failed) for s in rnd.steps] == [
                ("head", None),
                ("body", "quorum not met: 1 verified of 2 needed"),
            ]
            model = await GradientStore(w.coord_node).get(whole.cid)
            assert sorted(model.tensors) == ["fc.b", "fc.w"]  # the closed step's tensors only
            assert model.meta["steps"] == ["head"]
            first, second = coordinator.outcomes
            assert (first.status, second.status, second.record) == ("closed", "failed", None)
            assert coordinator.head == CID.parse(whole.record)  # round 1 left no record
        code, report = await audit(daemons[0].api_url, whole.record, coord.did)
        assert code == 0, report

    asyncio.run(go())
