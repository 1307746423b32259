"""A stepped round split between two coordinators on two Kubo daemons (docs/design/multicoord.md):
each runs only the steps it owns, the root combines them into the round/5 record naming each
step's owner, the output CID is the one a single coordinator gives, the audit passes, and an
owner that is SIGKILLed costs its steps only, named in the record."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gradstore.coordinator import Coordinator, Journal, closing
from gradstore.dag import CID
from gradstore.format import Gradient
from gradstore.job import JobConfig, parse_job
from gradstore.messages import SigningKey, SteppedRoundRecord, decode_stepped_record
from gradstore.node import KuboDaemon, KuboNode
from gradstore.peer import AggregateResult, Peer

from .harness import World, coordinator_process, job_toml, key, running
from .steps_harness import Heard, announce, listening, run_id, step_gradients
from .test_steps import audit

pytestmark = pytest.mark.kubo

ROOT = key(100)
OWNER = key(101)
PEERS = sorted((key(i) for i in range(3)), key=lambda k: k.did)


def split_job(
    owner: str | None = OWNER.did, *, head_deadline_s: float = 30.0, rounds: int = 1
) -> dict[str, Any]:
    """Three peers; step ``head`` (``fc.*``, median, all three) owned by ``owner``, then
    step ``body`` (``conv.*``, fedavg, quorum 2) owned by the root."""
    head: dict[str, Any] = {
        "name": "head",
        "tensors": ["fc.*"],
        "method": "median",
        "deadline_s": head_deadline_s,
    }
    if owner is not None:
        head["coordinator"] = owner
    return {
        "job": "test-job",
        "coordinator": ROOT.did,
        "peers": [k.did for k in PEERS],
        "aggregation": {"method": "fedavg"},
        "rounds": {"count": rounds, "quorum": 3, "deadline_s": 30.0},
        "steps": [head, {"name": "body", "tensors": ["conv.*"], "quorum": 2}],
    }


def coordinator(config: JobConfig, k: SigningKey, node: KuboNode, state: Path) -> Coordinator:
    return Coordinator(config, k, node, state, rebroadcast_s=0.5, linger_s=0, close_retry_s=2.0)


async def one_round(
    w: World, heard: Heard, run: str, steps: Sequence[str], grads: list[Any], samples: list[int]
) -> SteppedRoundRecord:
    """Every peer announces its document of each of ``steps``; the round's record, once out."""
    await asyncio.gather(
        *(
            announce(w, heard, i, 0, step, grads[i][step], samples[i], run)
            for i in range(3)
            for step in steps
        )
    )
    result = await heard.result(0, None, timeout=60)
    data = await w.coord_node.get_block(CID.parse(result.record))
    return decode_stepped_record(data, cid=CID.parse(result.record))


async def wait_topics(nodes: Sequence[KuboNode], topic: str) -> None:
    for node in nodes:
        await node.wait_for_topic_peers(topic, 1, timeout=15)


def test_two_coordinators_split_a_round_with_the_single_coordinators_output(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons: list[KuboDaemon] = kubo_factory(3, connect=True)
    split, whole = parse_job(split_job()), parse_job(split_job(None))
    grads, samples = step_gradients(3, 0), [5, 6, 7]

    async def go() -> None:
        root_node, owner_node, peer_node = (d.node() for d in daemons)
        try:
            w = World(split, ROOT, PEERS, root_node, [peer_node] * 3)
            root = coordinator(split, ROOT, root_node, tmp_path / "root")
            owner = coordinator(split, OWNER, owner_node, tmp_path / "owner")
            async with running(root), running(owner) as owner_task:
                await wait_topics([peer_node], split.gradients_topic)
                async with listening(w, peer_node) as heard:
                    run = await run_id(root)
                    assert await run_id(owner) == run  # adopted from the root's status
                    record = await one_round(w, heard, run, ["head", "body"], grads, samples)
                    # each step's result came from its owner, signed by it
                    assert heard.results(0, "head") and heard.results(0, "body")
                await asyncio.wait_for(owner_task, 30)  # its part of the round is over
            assert [(s.step, s.coordinator) for s in record.steps] == [
                ("head", OWNER.did),
                ("body", None),  # the root's own: the entry names no owner
            ]
            assert owner.outcomes[0].record is None and owner.outcomes[0].status == "closed"
            # the owner stayed until it heard the root's result, then stopped repeating its step
            assert owner.state.root_round == 0 and not owner.state.step_results
            assert [o.step for o in owner.outcomes[0].steps] == ["head"]
            code, report = await audit(daemons[0].api_url, str(root.head), ROOT.did)
            assert code == 0 and "model-level output" in report, report

            # the same job run by one coordinator, in the same run: the same output CID
            with Journal(tmp_path / "single" / "journal.sqlite") as journal:
                journal.bind(whole.job, ROOT.did)
                journal.set_meta("run", run)
            w1 = World(whole, ROOT, PEERS, root_node, [peer_node] * 3)
            single = coordinator(whole, ROOT, root_node, tmp_path / "single")
            async with running(single), listening(w1, peer_node) as heard1:
                assert await run_id(single) == run
                alone = await one_round(w1, heard1, run, ["head", "body"], grads, samples)
            assert alone.output == record.output
            assert [s.output for s in alone.steps] == [s.output for s in record.steps]
        finally:
            for n in (root_node, owner_node, peer_node):
                await n.aclose()

    asyncio.run(go())


def test_a_sigkilled_owner_costs_its_steps_and_is_named(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemons: list[KuboDaemon] = kubo_factory(3, connect=True)
    raw = split_job(head_deadline_s=4.0)
    config = parse_job(raw)
    job = job_toml(raw, tmp_path / "job.toml")
    keyfile = tmp_path / "owner.key"
    OWNER.save(keyfile)
    grads, samples = step_gradients(3, 0), [5, 6, 7]

    async def go() -> None:
        root_node, peer_node = daemons[0].node(), daemons[2].node()
        proc = coordinator_process(job, keyfile, daemons[1].api_url, tmp_path / "owner")
        try:
            w = World(config, ROOT, PEERS, root_node, [peer_node] * 3)
            root = coordinator(config, ROOT, root_node, tmp_path / "root")
            async with running(root):
                await wait_topics([peer_node], config.gradients_topic)
                async with listening(w, peer_node) as heard:
                    run = await run_id(root)
                    # the owner took the root's run and its peer 0's input to head: kill it
                    await announce(w, heard, 0, 0, "head", grads[0]["head"], samples[0], run)
                    proc.send_signal(signal.SIGKILL)
                    await asyncio.to_thread(proc.wait)
                    record = await one_round(w, heard, run, ["body"], grads, samples)
            assert record.round == 0 and record.run == run
            head, body = record.steps
            assert (head.step, head.coordinator, head.record) == ("head", OWNER.did, None)
            assert head.failed is not None and OWNER.did in head.failed, head.failed
            assert head.failed.startswith("unavailable: no result from its coordinator")
            assert body.step == "body" and body.output is not None and body.coordinator is None
            outcome = root.outcomes[0]
            assert outcome.status == "closed" and [o.step for o in outcome.steps] == ["body"]
            code, report = await audit(daemons[0].api_url, str(root.head), ROOT.did)
            assert code == 0, report
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for n in (root_node, peer_node):
                await n.aclose()

    asyncio.run(go())


def test_peers_hear_each_step_from_its_owner_and_the_round_from_the_root(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons: list[KuboDaemon] = kubo_factory(3, connect=True)
    config = parse_job(split_job(rounds=2))

    async def go() -> None:
        root_node, owner_node, peer_node = (d.node() for d in daemons)
        try:
            root = coordinator(config, ROOT, root_node, tmp_path / "root")
            owner = coordinator(config, OWNER, owner_node, tmp_path / "owner")
            async with running(root) as root_task, running(owner) as owner_task:
                await wait_topics([peer_node], config.gradients_topic)
                async with contextlib.AsyncExitStack() as stack:
                    peers = [
                        await stack.enter_async_context(
                            Peer(config, peer_node, k, first_backoff_s=0.3)
                        )
                        for k in PEERS
                    ]
                    for r in range(2):  # the owner goes on to round 1 on its own
                        grads = step_gradients(3, r)
                        whole = [
                            Gradient({**g["head"].tensors, **g["body"].tensors}) for g in grads
                        ]
                        # each waits for its head input to be verified: in the owner's status
                        sent = await asyncio.gather(
                            *(
                                p.publish_steps(whole[i], r, 5 + i, timeout=60)
                                for i, p in enumerate(peers)
                            )
                        )
                        assert all(sorted(s) == ["body", "head"] for s in sent)
                        got = {i.step: i async for i in peers[0].step_results(r, timeout=60)}
                        assert sorted(got) == ["body", "head"]
                        head = got["head"]
                        assert isinstance(head, AggregateResult)
                        assert head.peers == tuple(k.did for k in PEERS)
                        whole_result = await peers[1].await_result(r, timeout=60)  # the root's
                        assert whole_result.round == r
                await asyncio.wait_for(asyncio.gather(root_task, owner_task), 30)
            assert [o.status for o in root.outcomes] == ["closed", "closed"]
            assert [o.status for o in owner.outcomes] == ["closed", "closed"]
            assert str(whole_result.record) == str(root.head)
            code, report = await audit(daemons[0].api_url, str(root.head), ROOT.did)
            assert code == 0, report
        finally:
            for n in (root_node, owner_node, peer_node):
                await n.aclose()

    asyncio.run(go())


def test_a_lying_owners_step_is_caught_by_the_audit_of_the_roots_record(
    kubo_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    daemons: list[KuboDaemon] = kubo_factory(3, connect=True)
    config = parse_job(split_job())
    grads, samples = step_gradients(3, 0), [5, 6, 7]
    honest = closing.aggregate_streamed

    async def lying(*args: Any, **kwargs: Any) -> Any:
        """The owner's head aggregate, nudged: a part whose output is not its inputs'."""
        result, info = await honest(*args, **kwargs)
        if "fc.w" in result:
            result["fc.w"] = result["fc.w"] + 1.0
        return result, info

    monkeypatch.setattr(closing, "aggregate_streamed", lying)

    async def go() -> None:
        root_node, owner_node, peer_node = (d.node() for d in daemons)
        try:
            w = World(config, ROOT, PEERS, root_node, [peer_node] * 3)
            root = coordinator(config, ROOT, root_node, tmp_path / "root")
            owner = coordinator(config, OWNER, owner_node, tmp_path / "owner")
            async with running(root), running(owner):
                await wait_topics([peer_node], config.gradients_topic)
                async with listening(w, peer_node) as heard:
                    run = await run_id(root)
                    record = await one_round(w, heard, run, ["head", "body"], grads, samples)
            head = record.steps[0]
            assert head.coordinator == OWNER.did and head.record is not None  # signed, taken
            code, report = await audit(daemons[0].api_url, str(root.head), ROOT.did)
            assert code != 0, report
            assert "check output-cid failed: step 'head'" in report, report
            assert str(head.record) in report, report
        finally:
            for n in (root_node, owner_node, peer_node):
                await n.aclose()

    asyncio.run(go())
