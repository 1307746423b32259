"""A population job end to end on real Kubo daemons: the controller service runs every
interval, members train a tiny model through ``PopulationMember`` (report, then take the
decision: keep, or continue from a copied checkpoint fetched and verified block by block),
and the final record passes ``gradstore audit population``. Failure paths: a node that lies
about a member's checkpoint, a stranger's report, a member that goes silent mid-job."""

from __future__ import annotations

import asyncio
import itertools
import shlex
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from gradstore.cli import main
from gradstore.format import Gradient
from gradstore.job import JobConfig
from gradstore.messages import SigningKey
from gradstore.node import KuboNode, Node
from gradstore.population.controller import IntervalResult, population_topics
from gradstore.population.member import MemberDecision, PopulationMember
from gradstore.population.report import MemberReport, encode_report
from gradstore.population.service import PopulationController
from gradstore.store import GradientStore

from ..coordinator.test_failures import _FlipExport
from .helpers import BY_DID, CONTROLLER, RUN, job

_X = np.random.default_rng(0).standard_normal((64, 8))
_Y = _X @ np.linspace(-1.0, 1.0, 8)


def _train(w: np.ndarray, hp: dict[str, Any], steps: int) -> np.ndarray:
    """``steps`` of gradient descent on a least-squares problem, with weight decay."""
    for _ in range(steps):
        grad = _X.T @ (_X @ w - _Y) / len(_Y)
        w = w - float(hp["lr"]) * (grad + float(hp["wd"]) * w)
    return w


def _score(w: np.ndarray) -> float:
    return -float(np.mean((_X @ w - _Y) ** 2))


class Trace:
    """What one member saw: the decisions it got, and its weights before each report."""

    def __init__(self) -> None:
        self.decisions: list[MemberDecision] = []
        self.sent: list[np.ndarray] = []


async def _member(
    m: PopulationMember,
    trace: Trace,
    *,
    silent_from: int | None = None,
    before_report: Callable[[Gradient], Any] | None = None,
) -> None:
    hp = await m.start(timeout=60)
    w = np.zeros(8)
    while True:
        w = _train(w, hp, m.pop.interval_steps)
        if silent_from is not None and m.interval >= silent_from:
            return  # gone: never reports again
        ckpt = Gradient({"w": w})
        if before_report is not None:
            await before_report(ckpt)
        trace.sent.append(w)
        d = await m.report(m.interval, ckpt, _score(w), timeout=60)
        trace.decisions.append(d)
        if d.checkpoint is not None:
            w = np.array(d.checkpoint.tensors["w"])
        hp = d.hparams
        if d.done:
            return


async def _run_job(
    config: JobConfig,
    ctrl_node: Node,
    member_nodes: list[Node],
    *,
    silent: dict[str, int] | None = None,
    before_report: dict[str, Callable[[Gradient], Any]] | None = None,
) -> tuple[list[IntervalResult], dict[str, Trace]]:
    pop = config.population
    assert pop is not None
    controller = PopulationController(
        config,
        CONTROLLER,
        ctrl_node,
        run=RUN,
        rebroadcast_s=0.5,
        fetch_timeout_s=5.0,
        linger_s=1.0,
    )
    traces = {m: Trace() for m in pop.members}
    async with _Members(config, member_nodes) as members:
        tasks = [
            _member(
                members[did],
                traces[did],
                silent_from=(silent or {}).get(did),
                before_report=(before_report or {}).get(did),
            )
            for did in pop.members
        ]
        results, *_ = await asyncio.wait_for(asyncio.gather(controller.run(), *tasks), 120)
    return results, traces


class _Members:
    """Every member of the job, each on a node (round robin), entered together."""

    def __init__(self, config: JobConfig, nodes: list[Node]) -> None:
        pop = config.population
        assert pop is not None
        self.members = {
            did: PopulationMember(
                config, BY_DID[did], nodes[i % len(nodes)], rebroadcast_s=0.5, fetch_timeout_s=10
            )
            for i, did in enumerate(pop.members)
        }

    async def __aenter__(self) -> dict[str, PopulationMember]:
        for m in self.members.values():
            await m.__aenter__()
        return self.members

    async def __aexit__(self, *exc: object) -> None:
        for m in self.members.values():
            await m.__aexit__()


def _audit_cli(capsys: pytest.CaptureFixture[str], head: object, api: str) -> list[str]:
    capsys.readouterr()
    code = main(["audit", "population", str(head), "--coordinator", CONTROLLER.did, "--api", api])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out.splitlines()


def test_a_job_runs_every_interval_and_its_chain_audits(kubo_factory, capsys) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config = job(4, intervals=4, interval_steps=3, deadline_s=30.0, quantile_fraction=0.5)

    async def go() -> tuple[list[IntervalResult], dict[str, Trace]]:
        async with (
            daemons[0].node() as ctrl,
            daemons[1].node() as a,
            daemons[2].node() as b,
        ):
            return await _run_job(config, ctrl, [a, b])

    results, traces = asyncio.run(go())
    assert [r.record.interval for r in results] == [0, 1, 2, 3]
    assert results[0].record.prev is None
    for before, after in itertools.pairwise(results):
        assert after.record.prev == before.record_cid  # the chain links every decision
    for r in results:
        assert len(r.record.members) == 4 and not r.record.failed
        assert len(r.record.copies) == 2  # the bottom half copies the top half
    # every member got every decision; a copier continued from its source's reported weights
    copied = 0
    for t in traces.values():
        assert [d.interval for d in t.decisions] == [1, 2, 3, 4] and t.decisions[-1].done
        for i, d in enumerate(t.decisions):
            if d.source is None:
                assert d.checkpoint is None
                continue
            copied += 1
            np.testing.assert_array_equal(d.checkpoint.tensors["w"], traces[d.source].sent[i])
    assert copied == 8
    lines = _audit_cli(capsys, results[-1].record_cid, daemons[0].api_url)
    assert lines[-1].startswith(f"ok population of job {config.job}: 4 decision(s)")


def test_a_checkpoint_a_node_lies_about_is_excluded_and_a_stranger_refused(  # type: ignore[no-untyped-def]
    kubo_factory, capsys
) -> None:
    daemons = kubo_factory(2, connect=True)
    config = job(4, intervals=2, interval_steps=2, deadline_s=6.0)
    pop = config.population
    assert pop is not None
    liar_member = pop.members[1]
    liar = _FlipExport()
    stranger = SigningKey.from_seed(b"\x77" * 32)

    async def go() -> tuple[list[IntervalResult], dict[str, Trace]]:
        async with daemons[1].node() as peers:
            ctrl = KuboNode(daemons[0].api_url, transport=liar)
            try:
                store = GradientStore(peers)

                async def target(ckpt: Gradient) -> None:  # the node lies about these blocks
                    liar.target = str(await store.put(ckpt))

                async def stranger_reports(ckpt: Gradient) -> None:
                    # before a member's own report, from the same node: read in interval 0
                    rep = MemberReport(
                        config.job,
                        RUN,
                        0,
                        stranger.did,
                        await store.put(ckpt),
                        1e9,  # the best score there is: it must not be ranked
                        pop.first_hparams()[pop.members[0]],
                        1,
                    )
                    for _ in range(3):
                        await peers.publish(
                            population_topics(config.job)[0], encode_report(rep, stranger)
                        )

                return await _run_job(
                    config,
                    ctrl,
                    [peers],
                    before_report={liar_member: target, pop.members[0]: stranger_reports},
                )
            finally:
                await ctrl.aclose()

    results, _ = asyncio.run(go())
    first = results[0].record
    assert stranger_refused(results)
    assert stranger.did not in {m.report.member for m in first.members}
    (failed,) = [f for f in first.failed if f.member == liar_member]
    assert failed.reason.startswith("integrity:"), failed.reason
    assert liar_member in {c.member for c in first.copies}  # refilled by exploit
    assert liar_member not in {m.report.member for m in first.members}
    _audit_cli(capsys, results[-1].record_cid, daemons[1].api_url)


def stranger_refused(results: list[IntervalResult]) -> bool:
    """Whether a report from a peer not on the member list was refused, by its code."""
    return any(text.startswith("unknown-peer:") for r in results for text in r.refused)


def test_a_member_gone_silent_is_failed_at_its_deadline_and_refilled(kubo_factory, capsys) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(2, connect=True)
    config = job(4, intervals=3, interval_steps=2, deadline_s=3.0)
    pop = config.population
    assert pop is not None
    gone = pop.members[2]

    async def go() -> tuple[list[IntervalResult], dict[str, Trace]]:
        async with daemons[0].node() as ctrl, daemons[1].node() as peers:
            return await _run_job(config, ctrl, [peers], silent={gone: 1})

    results, traces = asyncio.run(go())
    assert [r.record.interval for r in results] == [0, 1, 2]  # the job went on to its end
    assert gone in {m.report.member for m in results[0].record.members}
    for r in results[1:]:
        (failed,) = r.record.failed
        assert failed.member == gone and failed.reason.startswith("absent:")
        assert gone in {c.member for c in r.record.copies}  # its slot is refilled
        assert len(r.record.members) == 3
    for did, t in traces.items():
        if did != gone:
            assert t.decisions[-1].done
    _audit_cli(capsys, results[-1].record_cid, daemons[0].api_url)


def test_gradstore_coordinator_runs_a_population_job_and_prints_its_audit(  # type: ignore[no-untyped-def]
    kubo_factory, capsys, tmp_path
) -> None:
    (daemon,) = kubo_factory(1)
    config = job(2, intervals=2, interval_steps=2, deadline_s=30.0)
    pop = config.population
    assert pop is not None
    key_file = tmp_path / "coord.key"
    CONTROLLER.save(key_file)
    members = ", ".join(f'"{m}"' for m in pop.members)
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        f'job = "{config.job}"\ncoordinator = "{CONTROLLER.did}"\npeers = [{members}]\n'
        "[population]\nintervals = 2\ninterval_steps = 2\ndeadline_s = 30.0\nseed = 7\n"
        "[population.hyperparam_mutations]\nlr = [0.001, 0.003, 0.01, 0.03, 0.1]\n"
        "wd = {low = 0.0, high = 0.001}\n"
    )
    argv = ["coordinator", "--config", str(job_file), "--key", str(key_file)]
    argv += ["--api", daemon.api_url]

    async def go() -> tuple[int | None, str, str]:
        async with daemon.node() as node, _Members(config, [node]) as ms:
            traces = {did: Trace() for did in pop.members}
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gradstore",
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                (out, err), *_ = await asyncio.wait_for(
                    asyncio.gather(
                        proc.communicate(), *(_member(ms[did], traces[did]) for did in pop.members)
                    ),
                    60,
                )
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            return proc.returncode, out.decode(), err.decode()

    code, out, err = asyncio.run(go())
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["interval 0", "interval 1"]
    audit = shlex.split(lines[-1].removeprefix("audit it: gradstore "))
    capsys.readouterr()
    assert main([*audit, "--api", daemon.api_url]) == 0
    assert "2 decision(s)" in capsys.readouterr().out
