"""``gradstore peer publish --step`` and ``gradstore peer await --step`` (issue 19 part 6).

The refusals need no node. The rest runs each command in its own process against a
scripted coordinator (tests/peer/scripted.py: the job's own key, publishing signed per-step
statuses and results) on real Kubo daemons.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from gradstore.compress import load_residual
from gradstore.dag import CID
from gradstore.format import CompressedGradient, Gradient
from gradstore.job import JobConfig
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon
from gradstore.store import GradientStore

from ..peer.scripted import STEP_TENSORS, ScriptedCoordinator, record_cid, stepped_job
from ..peer.test_steps import whole_gradient
from .conftest import Cli
from .helpers import unused_url, write_npz


def _job_toml(config: JobConfig, path: Path) -> Path:
    """The job file of ``scripted.stepped_job`` (or of a job without steps)."""
    peers = ", ".join(f'"{p}"' for p in config.peers)
    text = (
        f'job = "{config.job}"\ncoordinator = "{config.coordinator}"\npeers = [{peers}]\n'
        '[aggregation]\nmethod = "mean"\n[rounds]\ncount = 1\nquorum = 1\ndeadline_s = 30\n'
    )
    for step in config.steps if config.stepped else ():
        tensors = ", ".join(f'"{t}"' for t in step.tensors)
        members = ", ".join(f'"{p}"' for p in step.peers)
        text += f'[[steps]]\nname = "{step.name}"\ntensors = [{tensors}]\npeers = [{members}]\n'
    path.write_text(text)
    return path


def _files(tmp_path: Path, keys: Sequence[SigningKey]) -> tuple[Path, list[Path], Path]:
    config = stepped_job()[0]
    paths = []
    for i, k in enumerate(keys):
        k.save(tmp_path / f"p{i}.key")
        paths.append(tmp_path / f"p{i}.key")
    grad = write_npz(tmp_path / "whole.npz", **whole_gradient().tensors)
    return _job_toml(config, tmp_path / "job.toml"), paths, grad


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--step", "tail"], "job 'steps-job' has no step 'tail' (its steps: 'head', 'body', 'embed')"),
        (["--step", "body"], "is not among the peers of step 'body' of job 'steps-job'"),
    ],
)  # fmt: skip
def test_peer_publish_refuses_a_step_before_it_connects(
    cli: Cli, tmp_path: Path, argv: list[str], message: str
) -> None:
    _, _, keys = stepped_job()
    job, key_files, grad = _files(tmp_path, keys)
    line = cli("peer", "publish", "--config", job, "--key", key_files[1], "--round", 0,
               *argv, grad, "--api", unused_url()).one_error_line()  # fmt: skip
    assert message in line, line


def test_peer_publish_and_await_refuse_a_step_in_a_job_without_steps(
    cli: Cli, tmp_path: Path
) -> None:
    from ..coordinator.harness import make_job

    config, _, keys = make_job(1)
    job = _job_toml(config, tmp_path / "job.toml")
    keys[0].save(tmp_path / "p.key")
    grad = write_npz(tmp_path / "g.npz", w=np.ones(3, np.float32))
    line = cli("peer", "publish", "--config", job, "--key", tmp_path / "p.key", "--round", 0,
               "--step", "all", grad, "--api", unused_url()).one_error_line()  # fmt: skip
    assert line == "error: job 'test-job' has no [[steps]]: publish without a step"
    line = cli("peer", "await", "--config", job, "--round", 0, "--step", "all",
               "-o", tmp_path / "a.npz", "--api", unused_url()).one_error_line()  # fmt: skip
    assert line == "error: job 'test-job' has no [[steps]], so no step 'all'"
    assert not (tmp_path / "a.npz").exists()


async def _gradstore(tmp_path: Path, name: str, *argv: object) -> asyncio.subprocess.Process:
    """``python -m gradstore ARGV`` in its own process, output in files."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("GRADSTORE_API", None)
    with open(tmp_path / f"{name}.out", "wb") as out, open(tmp_path / f"{name}.err", "wb") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gradstore", *map(str, argv), stdout=out, stderr=err, env=env
        )


async def _finish(tmp_path: Path, name: str, proc: asyncio.subprocess.Process) -> list[str]:
    code = await asyncio.wait_for(proc.wait(), 90)
    err = (tmp_path / f"{name}.err").read_text()
    assert code == 0, f"{name} exited {code}: {err}"
    return (tmp_path / f"{name}.out").read_text().splitlines()


@pytest.mark.slow
def test_peer_publish_and_await_steps_on_kubo(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemons: list[KuboDaemon] = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    dids = [k.did for k in keys]
    job, key_files, grad = _files(tmp_path, keys)
    whole = whole_gradient()
    api = ["--api", daemons[1].api_url, "--timeout", 60]

    async def go() -> None:
        coord_node = daemons[0].node()
        procs: list[asyncio.subprocess.Process] = []
        try:
            async with ScriptedCoordinator(config, coord, coord_node).running() as c:
                for step in ("head", "body", "embed"):
                    await c.status(0, step)
                # peer 0, one step of its whole file
                p = await _gradstore(tmp_path, "body", "peer", "publish", "--config", job,
                                     "--key", key_files[0], "--round", 0, "--step", "body",
                                     "--compress", "bf16", grad, *api)  # fmt: skip
                procs.append(p)
                heard = await c.announcement(lambda a: a.step == "body", timeout=60)
                doc = await GradientStore(coord_node).get_any(CID.parse(heard.msg.cid))
                assert isinstance(doc, CompressedGradient)  # the step's tensors, compressed
                assert sorted(doc.tensors) == sorted(STEP_TENSORS["body"])
                assert doc.meta["step"] == "body"
                await c.status(0, "body", verified=dids[:1])
                assert await _finish(tmp_path, "body", p) == [heard.msg.cid]
                # peer 1, without --step: each of its steps, in the job's order
                p = await _gradstore(tmp_path, "mine", "peer", "publish", "--config", job,
                                     "--key", key_files[1], "--round", 0, "--compress", "bf16",
                                     grad, *api)  # fmt: skip
                procs.append(p)
                head = await c.announcement(lambda a: a.peer == dids[1] and a.step == "head")
                embed = await c.announcement(lambda a: a.peer == dids[1] and a.step == "embed")
                await c.status(0, "head", verified=dids[1:])
                await c.status(0, "embed", verified=dids[1:])
                assert await _finish(tmp_path, "mine", p) == [
                    f"head {head.msg.cid}",
                    f"embed {embed.msg.cid}",
                ]
                assert c.heard.index(head) < c.heard.index(embed)
                # await one step, and the whole round
                p_step = await _gradstore(tmp_path, "await-head", "peer", "await", "--config", job,
                                          "--round", 0, "--step", "head",
                                          "-o", tmp_path / "head.npz", *api)  # fmt: skip
                p_round = await _gradstore(tmp_path, "await-round", "peer", "await", "--config",
                                           job, "--round", 0, "-o", tmp_path / "round.npz",
                                           *api)  # fmt: skip
                procs += [p_step, p_round]
                store = GradientStore(coord_node)
                head_cid = await store.put(
                    Gradient({n: whole.tensors[n] for n in STEP_TENSORS["head"]})
                )
                await c.result(0, "head", head_cid, dids[1:], record_cid("head"))
                assert await _finish(tmp_path, "await-head", p_step) == [
                    f"{head_cid} {record_cid('head')}"
                ]
                assert p_round.returncode is None  # the round is not over with one step
                model = await store.put(Gradient(dict(whole.tensors)))
                await c.result(0, None, model, dids, record_cid("round"))
                assert await _finish(tmp_path, "await-round", p_round) == [
                    f"{model} {record_cid('round')}"
                ]
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            await coord_node.aclose()

    asyncio.run(go())
    with np.load(tmp_path / "head.npz") as got:
        assert sorted(got.files) == sorted(STEP_TENSORS["head"])
        np.testing.assert_array_equal(got["head.w"], whole.tensors["head.w"])
    with np.load(tmp_path / "round.npz") as got:
        assert sorted(got.files) == sorted(whole.tensors)
    # error feedback: a residual per step with --step; without, one for all of the peer's steps
    body = load_residual(tmp_path / "p0.key.residual-steps-job@body")
    mine = load_residual(tmp_path / "p1.key.residual-steps-job")
    assert body is not None and sorted(body) == sorted(STEP_TENSORS["body"])
    assert mine is not None and sorted(mine) == sorted(STEP_TENSORS["head"] + STEP_TENSORS["embed"])
    assert not (tmp_path / "p0.key.residual-steps-job").exists()


def test_peer_publish_of_a_peer_in_no_step_is_refused_before_it_connects(
    cli: Cli, tmp_path: Path
) -> None:
    from ..coordinator.harness import make_job

    _, coord, keys = make_job(2)
    dids = [k.did for k in keys]
    job = tmp_path / "job.toml"
    job.write_text(
        f'job = "lonely"\ncoordinator = "{coord.did}"\npeers = ["{dids[0]}", "{dids[1]}"]\n'
        f'[[steps]]\nname = "only"\ntensors = ["w"]\npeers = ["{dids[0]}"]\n'
    )
    keys[1].save(tmp_path / "p1.key")
    grad = write_npz(tmp_path / "g.npz", w=np.ones(3, np.float32))
    line = cli("peer", "publish", "--config", job, "--key", tmp_path / "p1.key", "--round", 0,
               grad, "--api", unused_url()).one_error_line()  # fmt: skip
    assert line == f"error: {dids[1]} is among the peers of no step of job 'lonely'"
