"""A round shared by coordinators in a two-level tree, on real Kubo daemons
(docs/design/multicoord.md, "The tree by peer groups"): two leaves each close their group
into a signed partial record, the root combines them into the flat exact round's output,
CID for CID, for every linear method (input and output clipping too), and ``gradstore audit round`` re-derives the whole tree; a SIGKILLed leaf
costs its group only, named in the record; a leaf that signs a partial that is not its
inputs' sums is taken by the root and fails the audit by name."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import aggregate_with_info
from gradstore.aggregate.methods import REGISTRY
from gradstore.aggregate.methods.base import Linear
from gradstore.cli._job_status import JobStatus
from gradstore.cli._round_status import Hearing, _hearing
from gradstore.coordinator import Coordinator, Journal, TreeRoot
from gradstore.coordinator import partial as partial_module
from gradstore.dag import CID, file_cid
from gradstore.errors import RoundFailedError
from gradstore.format import Gradient, encode
from gradstore.job import JobConfig, parse_job
from gradstore.messages import (
    SigningKey,
    TreeRecord,
    aggregate_meta,
    decode_partial_record,
    decode_tree_record,
)
from gradstore.node import KuboDaemon, KuboNode
from gradstore.peer import Peer

from .harness import coordinator_process, job_toml, key, running
from .test_steps import audit

pytestmark = pytest.mark.kubo

ROOT, LEAF_A, LEAF_B = key(100), key(110), key(111)
PEERS = sorted((key(i) for i in range(4)), key=lambda k: k.did)
SAMPLES = [3, 5, 7, 11]


#: Every linear method (the registry's), with what it takes: a tree job runs each one.
LINEAR: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "sum": {},
    "mean": {},
    "weighted": {"weights": {k.did: w for k, w in zip(PEERS, (0.5, 3.0, 0.25, 7.0), strict=True)}},
}


def tree_job(
    *, groups: bool = True, deadline_s: float = 30.0, method: str = "fedavg", **more: Any
) -> dict[str, Any]:
    """Four peers, ``method`` (its ``LINEAR`` settings and ``more``) accumulated exactly;
    with ``groups``, peers 0-1 in group ``a`` (leaf A) and 2-3 in ``b`` (leaf B), each
    group closing with all its peers."""
    raw: dict[str, Any] = {
        "job": "tree-job",
        "coordinator": ROOT.did,
        "peers": [k.did for k in PEERS],
        "aggregation": {"method": method, "accumulate": "exact", **LINEAR[method], **more},
        "rounds": {"count": 1, "quorum": 4, "deadline_s": deadline_s},
    }
    if groups:
        raw["groups"] = [
            {"name": "a", "coordinator": LEAF_A.did, "peers": [k.did for k in PEERS[:2]]},
            {"name": "b", "coordinator": LEAF_B.did, "peers": [k.did for k in PEERS[2:]]},
        ]
    return raw


def gradients() -> list[Gradient]:
    """Values whose float64 sums an ordered accumulation would round differently by group."""
    rng = np.random.default_rng(2222)
    return [
        Gradient(
            {
                "w": (rng.standard_normal((16, 9)) * 10.0 ** rng.integers(-6, 6)).astype(
                    np.float32
                ),
                "b": rng.standard_normal(5) * 1e8,
            }
        )
        for _ in PEERS
    ]


def leaf(config: JobConfig, group: str, k: SigningKey, node: KuboNode, state: Path) -> Coordinator:
    view = config.group_view(group)
    return Coordinator(view, k, node, state, rebroadcast_s=0.5, linger_s=0, close_retry_s=2.0)


def root_of(config: JobConfig, node: KuboNode, state: Path) -> TreeRoot:
    return TreeRoot(config, ROOT, node, state, rebroadcast_s=0.5, linger_s=0, close_retry_s=2.0)


async def publish(config: JobConfig, node: KuboNode, which: Sequence[int]) -> list[Any]:
    """Peers ``which`` publish their gradients (each waits until its coordinator verified it),
    then each awaits the round's result (the root's, in a tree job)."""
    grads = gradients()

    async def one(i: int) -> Any:
        async with Peer(config, node, PEERS[i], first_backoff_s=0.3) as peer:
            await peer.publish(grads[i], 0, SAMPLES[i], timeout=60)
            return await peer.await_result(0, timeout=60)

    return list(await asyncio.gather(*(one(i) for i in which)))


def for_a_process(raw: dict[str, Any], k: SigningKey, folder: Path) -> tuple[JobConfig, Path, Path]:
    """``raw`` parsed, and as the job file and ``k``'s key file a coordinator process reads."""
    keyfile = folder / "coordinator.key"
    k.save(keyfile)
    return parse_job(raw), job_toml(raw, folder / "job.toml"), keyfile


async def tree_record(node: KuboNode, cid: CID) -> TreeRecord:
    return decode_tree_record(await node.get_block(cid), cid=cid)


def test_every_linear_method_is_run_through_the_tree() -> None:
    linear = {name for name, cls in REGISTRY.items() if issubclass(cls, Linear)}
    assert set(LINEAR) == linear  # a new linear method gets its tree round below


#: Clips peers 0 and 2 (norms 1.66e8 and 2.27e8), not 1 and 3, and the output (9e7).
CLIPPED: dict[str, Any] = {"clip_input_norm": 1.6e8, "clip_output_norm": 5e7}


@pytest.mark.parametrize(
    ("method", "more"),
    [(m, {}) for m in LINEAR] + [pytest.param("fedavg", CLIPPED, id="fedavg-clipped")],
)
def test_a_tree_round_gives_the_flat_exact_rounds_output_and_audits(
    kubo_factory, tmp_path: Path, method: str, more: dict[str, Any]
) -> None:  # type: ignore[no-untyped-def]
    daemons: list[KuboDaemon] = kubo_factory(4, connect=True)
    tree = parse_job(tree_job(method=method, **more))
    flat = parse_job(tree_job(groups=False, method=method, **more))

    async def go() -> None:
        root_node, a_node, b_node, peer_node = (d.node() for d in daemons)
        try:
            root = root_of(tree, root_node, tmp_path / "root")
            leaf_a = leaf(tree, "a", LEAF_A, a_node, tmp_path / "a")
            leaf_b = leaf(tree, "b", LEAF_B, b_node, tmp_path / "b")
            async with running(root) as root_task, running(leaf_a), running(leaf_b):
                results = await publish(tree, peer_node, range(4))
                await asyncio.wait_for(root_task, 60)
            run = root.run_id
            assert leaf_a.run_id == leaf_b.run_id == run  # adopted from the root's status
            # each leaf stayed until it heard the root's result of its last round
            assert leaf_a.state.root_round == leaf_b.state.root_round == 0
            record = await tree_record(root_node, root.head)
            assert [(g.group, g.coordinator, g.failed) for g in record.groups] == [
                ("a", LEAF_A.did, None),
                ("b", LEAF_B.did, None),
            ]
            assert {r.cid for r in results} == {record.output}  # every peer got the root's
            assert leaf_a.outcomes[0].record == record.groups[0].record
            code, report = await audit(daemons[0].api_url, str(root.head), ROOT.did)
            assert code == 0 and "2 group(s) audited" in report, report
            listed = await round_list(daemons[0].api_url, str(root.head))
            assert listed["rounds"][0]["peers"] == sorted(k.did for k in PEERS), listed

            # the same job, flat, accumulated exactly, in the same run: the same output CID
            with Journal(tmp_path / "flat" / "journal.sqlite") as journal:
                journal.bind(flat.job, ROOT.did)
                journal.set_meta("run", run)
            single = Coordinator(
                flat, ROOT, root_node, tmp_path / "flat", rebroadcast_s=0.5, linger_s=5
            )
            async with running(single):
                alone = await publish(flat, peer_node, range(4))
            assert alone[0].cid == record.output
        finally:
            for n in (root_node, a_node, b_node, peer_node):
                await n.aclose()

    asyncio.run(go())


async def _heard(
    hearing: Hearing, since_ms: int, ok: Callable[[JobStatus], Any], timeout: float = 20.0
) -> JobStatus:
    """The job's status as ``hearing`` has it once ``ok`` holds (at most ``timeout`` s)."""
    end = time.monotonic() + timeout
    status = hearing.status(since_ms)
    while not (status.heard and ok(status)) and time.monotonic() < end:
        await hearing.next_message(0.5)
        status = hearing.status(since_ms)
    return status


async def round_show(api: str, record: str, state: Path | None = None) -> Any:
    """``gradstore round show RECORD`` (with ``--state``: the coordinator's journal)."""
    cmd = [sys.executable, "-m", "gradstore", "round", "show", record, "--api", api]
    cmd += [] if state is None else ["--state", str(state)]
    out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


async def round_list(api: str, head: str) -> Any:
    """``gradstore round list HEAD --json``: a tree record's round, its groups' peers."""
    cmd = [sys.executable, "-m", "gradstore", "round", "list", head, "--json", "--api", api]
    out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_a_sigkilled_leaf_costs_its_group_only_and_is_named(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemons: list[KuboDaemon] = kubo_factory(4, connect=True)
    config, job, keyfile = for_a_process(tree_job(deadline_s=4.0), LEAF_B, tmp_path)

    async def go() -> None:
        root_node, a_node, peer_node = daemons[0].node(), daemons[1].node(), daemons[3].node()
        proc = coordinator_process(job, keyfile, daemons[2].api_url, tmp_path / "b")
        try:
            root = root_of(config, root_node, tmp_path / "root")
            leaf_a = leaf(config, "a", LEAF_A, a_node, tmp_path / "a")
            since_ms = int(time.time() * 1000)
            async with AsyncExitStack() as stack:  # what `gradstore round status` hears
                hearing = await _hearing(stack, config, peer_node)
                async with running(root) as root_task, running(leaf_a):
                    view = config.group_view("b")  # leaf B is up: it listens on its group's topic
                    await peer_node.wait_for_topic_peers(view.gradients_topic, 1, timeout=30)
                    proc.send_signal(signal.SIGKILL)
                    await asyncio.to_thread(proc.wait)
                    killed_ms = int(time.time() * 1000)
                    publishing = asyncio.ensure_future(publish(config, peer_node, range(2)))
                    # group a closed (its leaf's result heard); the root waits for b
                    status = await _heard(
                        hearing, since_ms, lambda s: s.steps and s.steps[0].record
                    )
                    results = await publishing
                    await asyncio.wait_for(root_task, 60)
                ended = await _heard(hearing, since_ms, lambda s: s.last)
            # the open round, group by group, as the root and each leaf say it
            assert status.open_round == 0, status.lines()
            a_open, b_open = status.steps
            assert (a_open.step, a_open.leaf, a_open.state) == ("a", LEAF_A.did, "closed")
            assert a_open.record == str(leaf_a.outcomes[0].record) and a_open.verified == 2
            # leaf B said round 0 open before it was killed: open, and when it was last heard
            assert (b_open.step, b_open.leaf, b_open.state) == ("b", LEAF_B.did, "open")
            assert b_open.heard_at_ms is not None and b_open.heard_at_ms <= killed_ms
            text = "\n".join(status.lines())
            assert f"group a (leaf {LEAF_A.did}): closed, 2/2 aggregated, partial" in text, text
            assert f"group b (leaf {LEAF_B.did}): open, 0/2 verified" in text, text
            assert "its leaf last heard" in text, text
            groups = status.to_json()["open"]["groups"]
            assert [(g["group"], g["state"]) for g in groups] == [("a", "closed"), ("b", "open")]
            # the round ended: group b is not in the root's result
            assert ended.last is not None and ended.last.state == "closed", ended.lines()
            a_end, b_end = ended.last.groups
            assert (a_end.state, b_end.state) == ("closed", "failed"), ended.lines()
            assert b_end.failed is not None and "round's result" in b_end.failed
            assert ended.to_json()["last"]["groups"][1]["state"] == "failed"
            record = await tree_record(root_node, root.head)
            a, b = record.groups
            assert (a.group, a.failed, b.group, b.coordinator, b.record) == (
                "a",
                None,
                "b",
                LEAF_B.did,
                None,
            )
            assert b.failed is not None and b.failed.startswith(
                "unavailable: no result from its coordinator"
            ), b.failed
            assert LEAF_B.did in b.failed
            assert root.outcomes[0].status == "closed" and {r.cid for r in results} == {
                record.output
            }
            code, report = await audit(daemons[0].api_url, str(root.head), ROOT.did)
            assert code == 0 and "group b of round 0 failed" in report, report
            shown = await round_show(daemons[0].api_url, str(root.head), tmp_path / "root")
            assert [(g["group"], g["leaf"], g["status"]) for g in shown["groups"]] == [
                ("a", LEAF_A.did, "closed"),
                ("b", LEAF_B.did, "failed"),
            ], shown
            a_shown, b_shown = shown["groups"]
            assert a_shown["record"] == str(a.record) and a_shown["type"] == "gradstore/partial/1"
            assert sorted(p["peer"] for p in a_shown["peers"]) == sorted(k.did for k in PEERS[:2])
            assert b_shown["reason"] == b.failed
            assert shown["counts"] == {
                "groups": {"total": 2, "completed": 1, "failed": 1},
                "peers": 2,
                "aggregated": 2,
            }
            assert shown["stats"]["groups"] == {"total": 2, "completed": 1, "failed": 1}
            partial = await round_show(daemons[0].api_url, str(a.record))
            assert (partial["group"], partial["counts"]["aggregated"]) == ("a", 2), partial
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for n in (root_node, a_node, peer_node):
                await n.aclose()

    asyncio.run(go())


def test_a_lying_leaf_is_taken_by_the_root_and_fails_the_audit_by_name(
    kubo_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    daemons: list[KuboDaemon] = kubo_factory(4, connect=True)
    config = parse_job(tree_job())
    honest = partial_module.as_document
    grads = gradients()
    b_sum = math.fsum(float(np.float64(SAMPLES[i]) * grads[i].tensors["b"][0]) for i in (2, 3))

    def lying(rows: Any, layout: Any) -> Any:  # validly signed, not its inputs' sums
        out = honest(rows, layout)
        if out["b"][0, 0] == b_sum:  # group b's partial (peers 2 and 3)
            out["b"][0, 0] += 1.0
        return out

    monkeypatch.setattr(partial_module, "as_document", lying)

    async def go() -> None:
        root_node, a_node, b_node, peer_node = (d.node() for d in daemons)
        try:
            root = root_of(config, root_node, tmp_path / "root")
            leaf_a = leaf(config, "a", LEAF_A, a_node, tmp_path / "a")
            leaf_b = leaf(config, "b", LEAF_B, b_node, tmp_path / "b")
            async with running(root) as root_task, running(leaf_a), running(leaf_b):
                await publish(config, peer_node, range(4))
                await asyncio.wait_for(root_task, 60)
            record = await tree_record(root_node, root.head)
            assert all(g.failed is None for g in record.groups)  # the root re-derives nothing
            code, report = await audit(daemons[0].api_url, str(root.head), ROOT.did)
            assert code != 0, report
            assert "partial-output" in report and "group 'b'" in report, report
            assert str(record.groups[1].record) in report, report
        finally:
            for n in (root_node, a_node, b_node, peer_node):
                await n.aclose()

    asyncio.run(go())


def test_a_round_whose_every_group_failed_reaches_the_waiting_peers(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons: list[KuboDaemon] = kubo_factory(4, connect=True)
    config = parse_job(tree_job(deadline_s=3.0))

    async def go() -> None:
        root_node, a_node, b_node, peer_node = (d.node() for d in daemons)
        try:
            root = root_of(config, root_node, tmp_path / "root")
            leaf_a = leaf(config, "a", LEAF_A, a_node, tmp_path / "a")
            leaf_b = leaf(config, "b", LEAF_B, b_node, tmp_path / "b")
            async with running(root) as root_task, running(leaf_a), running(leaf_b):
                # nobody publishes: the leaves' rounds stay open, the root fails both groups
                async with Peer(config, peer_node, PEERS[0]) as peer:
                    with pytest.raises(RoundFailedError, match="every group failed"):
                        await peer.await_result(0, timeout=60)
                await asyncio.wait_for(root_task, 60)
            assert root.outcomes[0].status == "failed" and root.head is None
        finally:
            for n in (root_node, a_node, b_node, peer_node):
                await n.aclose()

    asyncio.run(go())


def test_a_sigkilled_root_resumes_its_round_with_the_journaled_partials(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons: list[KuboDaemon] = kubo_factory(4, connect=True)
    config, job, keyfile = for_a_process(tree_job(deadline_s=3.0), ROOT, tmp_path)
    state = tmp_path / "root"
    grads = gradients()

    async def go() -> None:
        root_node, a_node, b_node, peer_node = (d.node() for d in daemons)
        leaf_a = leaf(config, "a", LEAF_A, a_node, tmp_path / "a")
        leaf_b = leaf(config, "b", LEAF_B, b_node, tmp_path / "b")
        proc = coordinator_process(job, keyfile, daemons[0].api_url, state)
        try:
            async with running(leaf_b):
                a_task = asyncio.create_task(leaf_a.run())

                async def announce(i: int) -> None:
                    async with Peer(config, peer_node, PEERS[i], first_backoff_s=0.3) as peer:
                        await peer.publish(grads[i], 0, SAMPLES[i], timeout=60)

                await asyncio.gather(announce(0), announce(1))
                await _logged(state.with_suffix(".err"), "round 0 group a: took partial record")
                proc.send_signal(signal.SIGKILL)  # group a's part taken, group b still open
                await asyncio.to_thread(proc.wait)
                # leaf A gives up waiting for the root's result and stops repeating its own
                await asyncio.wait_for(a_task, 30)
                proc = coordinator_process(job, keyfile, daemons[0].api_url, state)
                results = await publish(config, peer_node, (2, 3))
                assert await asyncio.to_thread(proc.wait, 30) == 0
            record = await tree_record(root_node, CID.parse(results[0].record))
            assert [(g.group, g.failed) for g in record.groups] == [("a", None), ("b", None)]
            assert record.groups[0].record == leaf_a.outcomes[0].record  # read from the journal
            # the output is the flat exact round's over the four inputs, CID for CID
            inputs = [i for g in record.groups for i in (await partial_record(root_node, g)).inputs]
            assert [i.peer for i in inputs] == [k.did for k in PEERS]
            params = config.aggregation.params_for([k.did for k in PEERS])
            tensors, _ = aggregate_with_info([g.tensors for g in grads], params, SAMPLES)
            meta = aggregate_meta(
                config.job, 0, config.method, [i.gradient for i in inputs], run=record.run
            )
            assert {r.cid for r in results} == {record.output}
            assert file_cid(encode(Gradient(tensors, meta))) == record.output.to_v1()
            code, report = await audit(daemons[0].api_url, str(results[0].record), ROOT.did)
            assert code == 0 and "2 group(s) audited" in report, report
            # started again on its finished job, the root says the last round's result again
            async with Peer(config, peer_node, PEERS[0]) as late:
                proc = coordinator_process(job, keyfile, daemons[0].api_url, state)
                again = await late.await_result(0, timeout=30)
            assert (again.cid, again.record) == (record.output, results[0].record)
            assert await asyncio.to_thread(proc.wait, 30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for n in (root_node, a_node, b_node, peer_node):
                await n.aclose()

    asyncio.run(go())


async def _logged(path: Path, line: str, timeout: float = 30.0) -> None:
    """Wait until a coordinator process's log at ``path`` holds ``line``."""
    async with asyncio.timeout(timeout):
        while not path.is_file() or line not in path.read_text(errors="replace"):
            await asyncio.sleep(0.1)


async def partial_record(node: KuboNode, group: Any) -> Any:
    return decode_partial_record(await node.get_block(group.record), cid=group.record)
