"""A peer in a stepped job (issue 19 part 6), against a scripted coordinator on real Kubo:
it announces each step with its name (signed), stores only the step's tensors, hears each
step's status and result apart, and yields the steps' results as they close.

The coordinator is ``scripted.ScriptedCoordinator``: the job's own key publishing signed
per-step statuses and results, as the real coordinator's steps will.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgpack
import numpy as np
import pytest

from gradstore.dag import CID
from gradstore.dag.cid import DAG_CBOR
from gradstore.errors import Reason, RefusedError, RoundFailedError
from gradstore.format import Gradient
from gradstore.job import JobConfig
from gradstore.messages import SigningKey, decode_message
from gradstore.node import KuboDaemon, KuboNode
from gradstore.peer import AggregateResult, Peer, StepFailed
from gradstore.store import GradientStore

from ..coordinator.harness import make_job
from .scripted import STEP_TENSORS, ScriptedCoordinator, bare_status, record_cid, stepped_job

pytestmark = pytest.mark.kubo


def whole_gradient(seed: int = 7) -> Gradient:
    """Every tensor of the stepped job: what one backward pass gives."""
    rng = np.random.default_rng(seed)
    shapes = {"head.w": (4, 3), "head.b": (3,), "body.w": (5, 4), "body.b": (4,), "embed": (6,)}
    return Gradient({n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()})


@contextlib.asynccontextmanager
async def stage(
    daemons: Sequence[KuboDaemon], config: JobConfig, coord: SigningKey, keys: list[SigningKey]
) -> AsyncIterator[tuple[ScriptedCoordinator, list[Peer], KuboNode]]:
    """The scripted coordinator on daemon 0, one ``Peer`` per key on daemon 1, both ways
    subscribed; every step of round 0 open."""
    coord_node, peer_node = daemons[0].node(), daemons[1].node()
    try:
        async with (
            ScriptedCoordinator(config, coord, coord_node).running() as c,
            contextlib.AsyncExitStack() as stack,
        ):
            peers = [
                await stack.enter_async_context(
                    Peer(config, peer_node, k, first_backoff_s=0.5, coordinator_timeout_s=20)
                )
                for k in keys
            ]
            await peer_node.wait_for_topic_peers(config.gradients_topic, 1, timeout=15)
            await coord_node.wait_for_topic_peers(config.results_topic, 1, timeout=15)
            for step in config.steps if config.stepped else ():
                await c.status(0, step.name)
            if not config.stepped:
                await c.status(0, None)
            yield c, peers, coord_node
    finally:
        await coord_node.aclose()
        await peer_node.aclose()


def _sent(heard_data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = msgpack.unpackb(heard_data, raw=False)
    return out


def test_a_step_goes_out_named_in_its_signed_announcement_with_only_its_tensors(  # type: ignore[no-untyped-def]
    kubo_factory,
) -> None:
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    whole = whole_gradient()

    async def go() -> None:
        async with stage(daemons, config, coord, keys) as (c, (p0, p1), coord_node):
            publishing = asyncio.create_task(p0.publish(whole, 0, 5, step="body", timeout=30))
            heard = await c.announcement(lambda a: a.peer == keys[0].did)
            # the wire: `step` right after `round`, under the peer's signature
            wire = _sent(heard.data)
            assert list(wire)[:6] == ["v", "type", "job", "run", "round", "step"]
            assert wire["step"] == "body" and decode_message(heard.data).step == "body"
            # the document: the step's tensors only (the same values), and meta.step
            doc = await GradientStore(coord_node).get(CID.parse(heard.msg.cid))
            assert sorted(doc.tensors) == sorted(STEP_TENSORS["body"])
            for name in STEP_TENSORS["body"]:
                np.testing.assert_array_equal(doc.tensors[name], whole.tensors[name])
            assert doc.meta["step"] == "body" and doc.meta["peer"] == keys[0].did
            assert (doc.meta["round"], doc.meta["num_samples"]) == (0, 5)
            await c.status(0, "body", verified=[keys[0].did])
            assert await publishing == CID.parse(heard.msg.cid)

            # a whole gradient, every step of peer 1 (head and embed: it is not in body),
            # announced in the job's order, each its own document
            cids = await p1.publish_steps(whole, 0, 3, wait=False)
            assert list(cids) == ["head", "embed"]
            await c.announcement(lambda a: a.peer == keys[1].did and a.step == "embed")
            mine = [h for h in c.heard if h.msg.peer == keys[1].did]
            assert [h.msg.step for h in mine] == ["head", "embed"]
            assert [CID.parse(h.msg.cid) for h in mine] == list(cids.values())
            for step, cid in cids.items():
                doc = await GradientStore(coord_node).get(cid)
                assert sorted(doc.tensors) == sorted(STEP_TENSORS[step])
                assert doc.meta["step"] == step

    asyncio.run(go())


def test_a_refused_step_raises_with_its_code_and_step_after_the_others_verdicts(  # type: ignore[no-untyped-def]
    kubo_factory,
) -> None:
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    whole = whole_gradient()
    did = keys[1].did
    reason = "schema-mismatch: tensors are not step 'head''s"

    async def go() -> None:
        async with stage(daemons, config, coord, keys) as (c, (_, p1), _node):
            publishing = asyncio.create_task(p1.publish_steps(whole, 0, 3, timeout=30))
            await c.announcement(lambda a: a.step == "head")
            await c.announcement(lambda a: a.step == "embed")
            await c.status(0, "head", refused={did: reason})
            await asyncio.sleep(1.0)
            assert not publishing.done()  # embed has no verdict yet: it is still announced
            await c.status(0, "embed", verified=[did])
            with pytest.raises(RefusedError) as info:
                await publishing
            # one step alone
            single = asyncio.create_task(p1.publish(whole, 0, 3, step="head", timeout=30))
            with pytest.raises(RefusedError) as alone:
                await single
        for exc in (info.value, alone.value):
            assert exc.code is Reason.SCHEMA_MISMATCH and exc.reason == reason
            assert exc.step == "head" and exc.round == 0 and exc.peer == did
            assert str(exc) == (
                f"round 0 of job {config.job}, step 'head': the coordinator refused: {reason}"
            )

    asyncio.run(go())


async def _aggregate(node: KuboNode, step: str, value: float) -> CID:
    tensors = {n: np.full(3, value, np.float32) for n in STEP_TENSORS[step]}
    return await GradientStore(node).put(Gradient(tensors, {"kind": "aggregate", "step": step}))


def test_await_result_of_a_step_returns_while_another_is_open_and_is_not_woken_by_it(  # type: ignore[no-untyped-def]
    kubo_factory,
) -> None:
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    dids = [k.did for k in keys]

    async def go() -> None:
        async with stage(daemons, config, coord, keys) as (c, (p0, _), coord_node):
            head_cid = await _aggregate(coord_node, "head", 1.0)
            body_cid = await _aggregate(coord_node, "body", 2.0)
            body = asyncio.create_task(p0.await_result(0, step="body", timeout=30))
            whole = asyncio.create_task(p0.await_result(0, timeout=30))
            await c.result(0, "head", head_cid, dids, record_cid("head"))
            got = await p0.await_result(0, step="head", timeout=30)
            assert isinstance(got, AggregateResult) and got.step == "head"
            assert (got.cid, got.record, got.peers) == (head_cid, record_cid("head"), tuple(dids))
            assert sorted(got.gradient.tensors) == sorted(STEP_TENSORS["head"])
            # head's result, repeated by the beacon, wakes neither the body nor the round
            await asyncio.sleep(1.5)
            assert not body.done() and not whole.done()
            await c.result(0, "body", body_cid, dids[:1], record_cid("body"))
            got = await body
            assert (got.step, got.cid, got.peers) == ("body", body_cid, (dids[0],))
            np.testing.assert_array_equal(got.gradient.tensors["body.w"], np.full(3, 2.0))
            assert not whole.done()
            await c.status(0, "embed", failed="quorum not met: 0 verified of 1 needed")
            with pytest.raises(RoundFailedError) as info:
                await p0.await_result(0, step="embed", timeout=30)
            assert info.value.step == "embed" and str(info.value) == (
                f"step 'embed' of round 0 of job {config.job} failed: "
                "quorum not met: 0 verified of 1 needed"
            )
            # the round's own result: the model-level output and the round/5 record
            model = await GradientStore(coord_node).put(
                Gradient({"head.b": np.zeros(2, np.float32), "body.b": np.ones(2, np.float32)})
            )
            await c.result(0, None, model, dids, record_cid("round"))
            got = await whole
            assert (got.step, got.cid, got.record) == (None, model, record_cid("round"))
            assert sorted(got.gradient.tensors) == ["body.b", "head.b"]

    asyncio.run(go())


def test_step_results_yields_each_step_in_closing_order_and_ends(kubo_factory) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    dids = [k.did for k in keys]

    async def go() -> None:
        async with stage(daemons, config, coord, keys) as (c, (p0, _), coord_node):
            got: list[AggregateResult | StepFailed] = []

            async def consume() -> None:
                async for item in p0.step_results(0, timeout=30):
                    got.append(item)

            async def seen(n: int) -> None:
                while len(got) < n:
                    await asyncio.sleep(0.05)

            consuming = asyncio.create_task(consume())
            # closing order body, embed (failed), head: not the job's order head, body, embed
            await c.result(0, "body", await _aggregate(coord_node, "body", 2.0), dids[:1],
                           record_cid("body"))  # fmt: skip
            await asyncio.wait_for(seen(1), 10)  # yielded as soon as it closed
            await c.status(0, "embed", failed="quorum not met")
            await asyncio.wait_for(seen(2), 10)
            assert not consuming.done()
            head = await _aggregate(coord_node, "head", 1.0)
            await c.result(0, "head", head, dids, record_cid("head"))
            await asyncio.wait_for(consuming, 10)  # ends once every step has ended
            assert [getattr(i, "step", None) for i in got] == ["body", "embed", "head"]
            assert isinstance(got[0], AggregateResult) and got[0].record == record_cid("body")
            assert got[1] == StepFailed(0, "embed", "quorum not met")
            assert isinstance(got[2], AggregateResult) and got[2].cid == head

    asyncio.run(go())


def test_a_status_about_a_step_the_job_does_not_have_is_ignored(  # type: ignore[no-untyped-def]
    kubo_factory, caplog: pytest.LogCaptureFixture
) -> None:
    """Signed by the coordinator's key, but about a step named nowhere in the job: it changes
    nothing, and its lists block (which nobody has) is not fetched, which would hold up
    every message after it for the fetch's 10 s."""
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    did = keys[0].did
    nowhere = str(CID.hash(DAG_CBOR, b"a lists block nobody has"))

    async def go() -> float:
        async with stage(daemons, config, coord, keys) as (c, (p0, _), _node):
            hostile = bare_status(config, "nope", lists=nowhere)
            await c.send(hostile)
            started = time.monotonic()
            publishing = asyncio.create_task(p0.publish(whole_gradient(), 0, 5, step="head"))
            await c.announcement(lambda a: a.step == "head")
            await c.status(0, "head", verified=[did])
            await asyncio.wait_for(publishing, 30)
            assert p0._reader is not None and not p0._reader.done()
            return time.monotonic() - started

    with caplog.at_level(logging.WARNING, logger="gradstore.peer"):
        took = asyncio.run(go())
    assert took < 6.0, f"the peer took {took:.1f} s: it fetched the hostile status's lists"
    assert any("about step 'nope'" in r.getMessage() for r in caplog.records)


def test_a_status_naming_a_step_does_not_fail_a_job_without_steps(kubo_factory) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = make_job(2, method="mean", quorum=1)
    dids = [k.did for k in keys]

    async def go() -> AggregateResult:
        async with stage(daemons, config, coord, keys[:1]) as (c, (p0,), coord_node):
            waiting = asyncio.create_task(p0.await_result(0, timeout=30))
            await c.send(bare_status(config, "all", failed="a step's failure is no round's"))
            await asyncio.sleep(1.0)
            assert not waiting.done()
            cid = await GradientStore(coord_node).put(Gradient({"w": np.ones(3, np.float32)}))
            await c.result(0, None, cid, dids[:1], record_cid("round"))
            return await waiting

    got = asyncio.run(go())
    assert got.step is None and got.peers == (keys[0].did,)
