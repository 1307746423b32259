"""A whole job through the command line, each role in its own process, on one real Kubo daemon."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gradstore.node import KuboDaemon

from .conftest import Cli
from .helpers import SEED, write_npz

pytestmark = [pytest.mark.kubo, pytest.mark.slow]

CID = r"(baf[a-z2-7]+)"


def _topics(kubo: KuboDaemon) -> set[str]:
    """The topics the daemon's clients subscribe to (the ``ipfs`` CLI prints them decoded)."""
    return set(kubo.run("pubsub", "ls").stdout.decode().split())


def _wait_topic(kubo: KuboDaemon, topic: str, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 60
    while topic not in _topics(kubo):
        assert all(p.poll() is None for p in procs), "a process exited early"
        assert time.monotonic() < deadline, f"nobody subscribed to {topic}"
        time.sleep(0.1)


def _start(tmp_path: Path, name: str, *argv: object) -> subprocess.Popen[bytes]:
    """``python -m gradstore ARGV`` with output in files (a full pipe never blocks it)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("GRADSTORE_API", None)
    with open(tmp_path / f"{name}.out", "wb") as out, open(tmp_path / f"{name}.err", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "gradstore", *map(str, argv)], stdout=out, stderr=err, env=env
        )


def _exit_code(tmp_path: Path, name: str, proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    """Wait for a process; return its exit code and stderr."""
    try:
        code = proc.wait(timeout=180)
    finally:
        _kill(proc)
    return code, (tmp_path / f"{name}.err").read_text()


def _kill(*procs: subprocess.Popen[bytes]) -> None:
    """Kill whichever of ``procs`` still run, and reap them."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start_coordinator(
    tmp_path: Path, kubo: KuboDaemon, job: Path, key: Path, job_name: str
) -> subprocess.Popen[bytes]:
    """``gradstore coordinator`` on ``kubo``, returned once it listens for announcements."""
    coord = _start(
        tmp_path, "coord", "coordinator", "--config", job, "--key", key,
        "--api", kubo.api_url, "--state", tmp_path / "state",
    )  # fmt: skip
    try:
        _wait_topic(kubo, f"gradstore/v1/{job_name}/gradients", [coord])
    except BaseException:
        _kill(coord)
        raise
    return coord


def _finish(tmp_path: Path, name: str, proc: subprocess.Popen[bytes]) -> str:
    """Wait for a process; assert exit 0; return its stdout."""
    code, err = _exit_code(tmp_path, name, proc)
    out = (tmp_path / f"{name}.out").read_text()
    assert code == 0, f"{name} exited {code}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def test_job_through_the_cli(cli: Cli, kubo: KuboDaemon, tmp_path: Path) -> None:
    api = kubo.api_url
    keys = {name: tmp_path / f"{name}.key" for name in ("coord", "alice", "bob")}
    dids = {name: cli("keygen", "--out", path).line for name, path in keys.items()}
    job = tmp_path / "job.toml"
    job.write_text(
        f'job = "cli-{os.getpid()}"\n'
        f'coordinator = "{dids["coord"]}"\n'
        f'peers = ["{dids["alice"]}", "{dids["bob"]}"]\n'
        '[aggregation]\nmethod = "fedavg"\n'
        "[rounds]\ncount = 1\nquorum = 2\ndeadline_s = 120\n"
    )
    rng = np.random.default_rng(SEED)
    grads = {
        name: write_npz(
            tmp_path / f"{name}.npz",
            w=rng.standard_normal((32, 10)).astype(np.float32),
            b=rng.standard_normal(10).astype(np.float32),
        )
        for name in ("alice", "bob")
    }
    samples = {"alice": 30, "bob": 10}
    job_name = f"cli-{os.getpid()}"

    coord = _start_coordinator(tmp_path, kubo, job, keys["coord"], job_name)
    procs = [coord]
    try:
        waiter = _start(
            tmp_path, "await", "peer", "await", "--config", job, "--round", 0,
            "-o", tmp_path / "agg.npz", "--timeout", 150, "--api", api,
        )  # fmt: skip
        procs.append(waiter)
        _wait_topic(kubo, f"gradstore/v1/{job_name}/results", procs)
        publishers = {
            name: _start(
                tmp_path,
                name,
                "peer",
                "publish",
                "--config",
                job,
                "--key",
                keys[name],
                "--round",
                0,
                "--num-samples",
                samples[name],
                "--timeout",
                150,
                "--api",
                api,
                grads[name],
            )
            for name in ("alice", "bob")
        }
        procs.extend(publishers.values())
        published = {name: _finish(tmp_path, name, p).strip() for name, p in publishers.items()}
        awaited = _finish(tmp_path, "await", waiter)
        coord_out = _finish(tmp_path, "coord", coord)
    finally:
        _kill(*procs)

    for name, line in published.items():
        assert re.fullmatch(CID, line), (name, line)

    # coordinator: one line for its one round, naming the aggregate and the record
    lines = coord_out.splitlines()
    assert len(lines) == 1, coord_out
    m = re.match(
        rf"round 0 closed: 2 peers \(2/2 verified\), aggregate {CID} record {CID}", lines[0]
    )
    assert m, lines[0]
    aggregate_cid, record_cid = m.groups()
    assert awaited.split() == [aggregate_cid, record_cid]

    # the saved aggregate is the one `gradstore aggregate` computes offline (inputs by peer id)
    order = sorted(("alice", "bob"), key=lambda n: dids[n])
    offline = tmp_path / "offline.npz"
    r = cli(
        "aggregate", "--method", "fedavg", "--num-samples", *(samples[n] for n in order),
        *(grads[n] for n in order), "-o", offline,
    )  # fmt: skip
    assert r.code == 0, r.err
    with np.load(tmp_path / "agg.npz") as got, np.load(offline) as want:
        assert set(got.files) == {"w", "b"}
        for name in got.files:
            assert got[name].tobytes() == want[name].tobytes()
    assert cli("get", aggregate_cid, "-o", tmp_path / "again.npz", "--api", api).code == 0

    # round show: the record as JSON with each peer's status and gradient CID
    r = cli("round", "show", record_cid, "--api", api)
    assert r.code == 0 and r.err == ""
    record = json.loads(r.out)
    assert record["record"] == record_cid and record["output"] == aggregate_cid
    assert (record["job"], record["round"], record["method"]) == (job_name, 0, "fedavg")
    assert record["coordinator"] == dids["coord"] and record["prev"] is None
    peers = {p["peer"]: p for p in record["peers"]}
    assert peers.keys() == {dids["alice"], dids["bob"]}
    for name in ("alice", "bob"):
        peer = peers[dids[name]]
        assert peer["status"] == "aggregated"
        assert peer["gradient"] == published[name]
        assert peer["num_samples"] == samples[name]
    assert [p["peer"] for p in record["peers"]] == sorted(peers)
    assert record["counts"] == {"expected": 2, "aggregated": 2, "absent": 0, "failed": 0}

    # with the coordinator's journal, the round's stats (what a user asks after a slow round)
    r = cli("round", "show", record_cid, "--api", api, "--state", tmp_path / "state")
    assert r.code == 0, r.err
    stats = json.loads(r.out)["stats"]
    assert stats["expected"] == stats["verified"] == 2 and stats["bytes_fetched"] > 0
    assert {"resolve_s", "aggregate_s", "publish_s", "open_s"} <= stats.keys()
    r = cli("round", "show", record_cid, "--api", api, "--state", tmp_path / "nowhere")
    assert r.code == 1 and "no coordinator journal" in r.err


def test_a_refused_peer_and_a_failed_round_say_why(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path
) -> None:
    api = kubo.api_url
    keys = {name: tmp_path / f"{name}.key" for name in ("coord", "alice")}
    dids = {name: cli("keygen", "--out", path).line for name, path in keys.items()}
    job_name = f"fail-{os.getpid()}"
    job = tmp_path / "job.toml"
    job.write_text(
        f'job = "{job_name}"\ncoordinator = "{dids["coord"]}"\npeers = ["{dids["alice"]}"]\n'
        "[rounds]\ncount = 1\nquorum = 1\ndeadline_s = 8\n"
    )
    coord = _start_coordinator(tmp_path, kubo, job, keys["coord"], job_name)
    procs = [coord]
    try:
        started = time.monotonic()
        waiter = _start(
            tmp_path, "await", "peer", "await", "--config", job, "--round", 0,
            "-o", tmp_path / "agg.npz", "--timeout", 120, "--api", api,
        )  # fmt: skip
        procs.append(waiter)
        bad = tmp_path / "nan.npz"
        np.savez(bad, w=np.array([1.0, np.nan], dtype=np.float32))
        publisher = _start(
            tmp_path, "publish", "peer", "publish", "--config", job, "--key", keys["alice"],
            "--round", 0, "--num-samples", 5, bad, "--api", api, "--timeout", 60,
        )  # fmt: skip
        procs.append(publisher)
        pub_code, pub_err = _exit_code(tmp_path, "publish", publisher)
        code, err = _exit_code(tmp_path, "await", waiter)
        waited = time.monotonic() - started
        coord_code, coord_err = _exit_code(tmp_path, "coord", coord)
    finally:
        _kill(*procs)
    # the peer hears why its input was refused, from the coordinator's signed status
    assert pub_code == 1 and pub_err.strip().splitlines() == [
        f"error: round 0 of job {job_name}: the coordinator refused: "
        "non-finite: tensor 'w' holds NaN or Inf"
    ], pub_err
    assert code == 1 and err.strip().splitlines() == [
        f"error: round 0 of job {job_name} failed: quorum not met: 0 verified of 1 needed"
    ], err
    assert waited < 60  # told by the coordinator's status, not by its own 120 s timeout
    # the coordinator said where the round stood while it was open, then that it failed,
    # and exits 3 (a round failed) instead of 0
    assert not (tmp_path / "agg.npz").exists()
    assert (tmp_path / "coord.out").read_text().startswith("round 0 failed: quorum not met")
    waiting = [line for line in coord_err.splitlines() if "waiting for peers" in line]
    assert waiting[0] == (
        "round 0: waiting for peers (0/1 verified, 0 received, quorum 1, "
        "the deadline starts at the first announcement)"
    ), coord_err
    assert coord_code == 3, coord_err
    assert coord_err.splitlines()[-1] == (
        f"error: 1 of 1 round(s) of job {job_name} failed; round 0: "
        "quorum not met: 0 verified of 1 needed"
    )
    # started again on its state folder: the job is complete, exit 0 (a supervisor stops)
    again = _start(
        tmp_path, "again", "coordinator", "--config", job, "--key", keys["coord"],
        "--api", api, "--state", tmp_path / "state",
    )  # fmt: skip
    code, err = _exit_code(tmp_path, "again", again)
    assert code == 0 and err.startswith(f"job {job_name} already complete: 1 round(s), 1 failed")
