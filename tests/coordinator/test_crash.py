"""SIGKILL the coordinator process mid-round and restart it: the round completes from its
journal, every accepted input is used once, and the result is the one a clean run gives."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradstore.aggregate import aggregate
from gradstore.dag import file_cid
from gradstore.format import Gradient, encode
from gradstore.messages import aggregate_meta, decode_record
from gradstore.peer import Peer

from .harness import gradients, make_job, publish_all, wait_subscribed, world, write_job_toml

pytestmark = pytest.mark.kubo


def _coordinator(
    job: Path, key: Path, api: str, state: Path, logs: Path
) -> subprocess.Popen[bytes]:
    """The real CLI in its own process; output to files so a full pipe never blocks it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "gradstore",
        "coordinator",
        "--config",
        str(job),
        "--key",
        str(key),
        "--api",
        api,
        "--state",
        str(state),
        "-v",
    ]
    with open(logs.with_suffix(".out"), "wb") as out, open(logs.with_suffix(".err"), "wb") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, env=env)


def record_run(state: Path) -> str:
    with sqlite3.connect(state / "journal.sqlite") as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()
    return str(json.loads(row[0]))


def _accepted(state: Path) -> int:
    db = state / "journal.sqlite"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM inputs WHERE round = 0").fetchone()[0])


def test_sigkill_mid_round_then_restart_gives_the_clean_result(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(4, method="fedavg", deadline_s=120)
    job = write_job_toml(config, tmp_path / "job.toml")
    key = tmp_path / "coordinator.key"
    coord.save(key)
    state = tmp_path / "state"
    grads = gradients(4, 0)
    samples = [5, 6, 7, 8]

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            first = _coordinator(job, key, daemons[0].api_url, state, tmp_path / "first")
            try:
                await wait_subscribed(w)
                await publish_all(
                    w, 0, [grads[0], grads[1], None, None], samples
                )  # acked = journaled
                assert _accepted(state) == 2
            finally:
                first.send_signal(signal.SIGKILL)
                first.wait(10)
            assert first.returncode == -signal.SIGKILL

            second = _coordinator(job, key, daemons[0].api_url, state, tmp_path / "second")
            try:
                await wait_subscribed(w)
                async with Peer(config, w.peer_nodes[0]) as listener:
                    await publish_all(w, 0, [None, None, grads[2], grads[3]], samples)
                    result = await listener.await_result(0, timeout=60)
                await asyncio.to_thread(second.wait, 60)
            finally:
                if second.poll() is None:
                    second.kill()
                    second.wait()
            out = (tmp_path / "second.out").read_text()
            err = (tmp_path / "second.err").read_text()
            assert second.returncode == 0, err[-2000:]
            assert f"resuming job test-job run {record_run(state)} at round 0" in err
            assert f"aggregate {result.cid} record {result.record}" in out

            record = decode_record(await w.coord_node.get_block(result.record), cid=result.record)
            assert [i.peer for i in record.inputs] == [p.did for p in peers]  # each exactly once
            assert [i.num_samples for i in record.inputs] == samples
            clean = aggregate(
                [g.tensors for g in grads], config.params_for([p.did for p in peers]), samples
            )
            assert record.run == record_run(state)  # the restart resumed the same run
            meta = aggregate_meta(
                config.job, 0, "fedavg", [i.gradient for i in record.inputs], run=record.run
            )
            assert file_cid(encode(Gradient(clean, meta))) == result.cid

    started = time.monotonic()
    asyncio.run(go())
    assert time.monotonic() - started < 120
