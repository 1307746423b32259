"""SIGKILL the coordinator process mid-round and restart it: the round completes from its
journal, every accepted input is used once, and the result is the one a clean run gives;
in a stepped job, a step closed before the kill stays closed with the same CIDs."""

from __future__ import annotations

import asyncio
import contextlib
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
from gradstore.dag import CID, file_cid
from gradstore.format import Gradient, encode
from gradstore.job import JobConfig
from gradstore.messages import aggregate_meta, decode_record, decode_stepped_record
from gradstore.peer import Peer

from .harness import gradients, make_job, publish_all, wait_subscribed, world, write_job_toml
from .steps_harness import announce, listening, step_gradients, stepped_job
from .test_steps import expected_output

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
    with contextlib.closing(sqlite3.connect(state / "journal.sqlite")) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()
    return str(json.loads(row[0]))


def _accepted(state: Path) -> int:
    db = state / "journal.sqlite"
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(db)) as conn:
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


def _stepped_toml(config: JobConfig, path: Path) -> Path:
    """The job file of ``config``'s two steps: head (mean, quorum 2, deadline 4 s), body."""
    peers = ", ".join(f'"{p}"' for p in config.peers)
    path.write_text(
        f'job = "{config.job}"\ncoordinator = "{config.coordinator}"\npeers = [{peers}]\n'
        '[aggregation]\nmethod = "fedavg"\n[rounds]\ncount = 1\nquorum = 2\ndeadline_s = 120\n'
        '[[steps]]\nname = "head"\ntensors = ["fc.*"]\nmethod = "mean"\ndeadline_s = 4\n'
        '[[steps]]\nname = "body"\ntensors = ["conv.*"]\n'
    )
    return path


async def _run_of(state: Path) -> str:
    for _ in range(300):
        if (state / "journal.sqlite").exists():
            with contextlib.suppress(sqlite3.Error, TypeError):
                return record_run(state)
        await asyncio.sleep(0.05)
    raise AssertionError("the coordinator never bound its journal")


def test_sigkill_mid_stepped_round_then_restart_gives_identical_cids_for_every_step(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = stepped_job(
        head={"method": "mean", "quorum": 2, "deadline_s": 4.0}, deadline_s=120
    )
    job = _stepped_toml(config, tmp_path / "job.toml")
    key = tmp_path / "coordinator.key"
    coord.save(key)
    state = tmp_path / "state"
    grads = step_gradients(3, 0)
    samples = [5, 6, 7]
    dids = [k.did for k in peers]

    async def go() -> None:
        async with (
            world(daemons, config, coord, peers) as w,
            listening(w, w.peer_nodes[0]) as heard,
        ):
            first = _coordinator(job, key, daemons[0].api_url, state, tmp_path / "first")
            try:
                run = await _run_of(state)
                await wait_subscribed(w)
                for i in (0, 1):
                    await announce(w, heard, i, 0, "head", grads[i]["head"], samples[i], run)
                await announce(w, heard, 0, 0, "body", grads[0]["body"], samples[0], run)
                head = await heard.result(0, "head", timeout=30)  # at head's deadline
                assert heard.results(0, None) == []
            finally:
                first.send_signal(signal.SIGKILL)
                first.wait(10)
            assert first.returncode == -signal.SIGKILL

            heard.messages.clear()
            second = _coordinator(job, key, daemons[0].api_url, state, tmp_path / "second")
            try:
                await wait_subscribed(w)
                # peer 2's head comes after head closed: it must not change head's output
                await announce(
                    w, heard, 2, 0, "head", grads[2]["head"], samples[2], run, until_received=False
                )
                reason = await heard.until(lambda: heard.refusal(0, "head", dids[2]))
                assert reason == "stale-round: round 0's step 'head' is over"
                again = await heard.result(0, "head", timeout=30)  # repeated from the journal
                for i in (1, 2):
                    await announce(w, heard, i, 0, "body", grads[i]["body"], samples[i], run)
                body = await heard.result(0, "body", timeout=60)
                whole = await heard.result(0, None, timeout=60)
                await asyncio.to_thread(second.wait, 60)
            finally:
                if second.poll() is None:
                    second.kill()
                    second.wait()
            err = (tmp_path / "second.err").read_text()
            assert second.returncode == 0, err[-2000:]
            assert f"resuming job test-job run {run} at round 0" in err
            assert "round 0 step head closed" not in err  # closed before the kill, only
            assert "round 0 step body closed" in err

            assert (again.cid, again.record) == (head.cid, head.record)
            assert head.cid == expected_output(w, run, "head", [0, 1], grads, samples)
            assert body.cid == expected_output(w, run, "body", [0, 1, 2], grads, samples)
            rnd = decode_stepped_record(
                await w.coord_node.get_block(CID.parse(whole.record)), cid=CID.parse(whole.record)
            )
            assert [(s.step, str(s.record), str(s.output)) for s in rnd.steps] == [
                ("head", head.record, head.cid),
                ("body", body.record, body.cid),
            ]
            assert rnd.run == run

    asyncio.run(go())


#: A coordinator in its own process that reads every input back (``keep_bytes=0``: from its
#: spill files). With ``hang``, its aggregation pass stops for good after its first reads
#: (a marker file says so), for the test to SIGKILL it there.
_SPILLING = """
import asyncio, json, logging, sys
from pathlib import Path
from gradstore.coordinator import Coordinator, closing
from gradstore.job import load_job
from gradstore.messages import SigningKey
from gradstore.node import KuboNode

job, key, api, state, hang = sys.argv[1:6]
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
if hang:
    real = closing.aggregate_streamed

    class Hanging:
        def __init__(self, source):
            self.source, self.reads = source, 0

        async def read(self, name, start, stop):
            self.reads += 1
            if self.reads > 1:  # the first tensor is read: hang on the next
                Path(hang).touch()
                await asyncio.sleep(3600)
            return await self.source.read(name, start, stop)

    async def hanging(sources, *args, **kwargs):
        return await real([Hanging(s) for s in sources], *args, **kwargs)

    closing.aggregate_streamed = hanging

async def main():
    node = KuboNode(api)
    try:
        coordinator = Coordinator(
            load_job(job), SigningKey.load(key), node, state, keep_bytes=0, linger_s=0,
            spill=True,
        )
        (outcome,) = await coordinator.run()
        print(json.dumps({"status": outcome.status, "output": str(outcome.output),
                          "record": str(outcome.record),
                          "spilled": outcome.stats.get("spilled_inputs")}), flush=True)
    finally:
        await node.aclose()

asyncio.run(main())
"""


def test_sigkill_mid_aggregation_then_restart_gives_identical_cids_and_drops_spills(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Killed while its aggregation pass reads the spill files; the restart deletes every
    spill folder it finds (the crash's, a past round's), verifies the journaled inputs
    again and closes the round with the clean run's output; then its folder goes too."""
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(4, method="median", deadline_s=120)
    job = write_job_toml(config, tmp_path / "job.toml")
    key = tmp_path / "coordinator.key"
    coord.save(key)
    state = tmp_path / "state"
    grads = gradients(4, 0, shape=(700, 600))  # 1.6 MiB: several windows' reads, leaves
    samples = [5, 6, 7, 8]
    marker = tmp_path / "aggregating"

    def spawn(name: str, hang: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-c", _SPILLING, str(job), str(key), daemons[0].api_url]
        with (
            open(tmp_path / f"{name}.out", "wb") as out,
            open(tmp_path / f"{name}.err", "wb") as err,
        ):
            return subprocess.Popen([*cmd, str(state), hang], stdout=out, stderr=err)

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            first = spawn("first", str(marker))
            try:
                await wait_subscribed(w)
                await publish_all(w, 0, grads, samples)
                for _ in range(600):
                    if marker.exists() or first.poll() is not None:
                        break
                    await asyncio.sleep(0.05)
                assert marker.exists(), (tmp_path / "first.err").read_text()[-2000:]
                spilled = list((state / "spill" / "round-0").iterdir())
                assert len(spilled) == 4  # the aggregation pass reads these
            finally:
                first.send_signal(signal.SIGKILL)
                first.wait(10)
            assert first.returncode == -signal.SIGKILL
            with contextlib.closing(sqlite3.connect(state / "journal.sqlite")) as conn:
                assert conn.execute(
                    "SELECT count(*) FROM rounds WHERE record IS NOT NULL"
                ).fetchone() == (0,)
            stale = state / "spill" / "round-7"
            stale.mkdir()
            (stale / "left.doc").write_bytes(b"from a past run")

            second = spawn("second", "")
            try:
                await asyncio.to_thread(second.wait, 90)
            finally:
                if second.poll() is None:
                    second.kill()
                    second.wait()
            err = (tmp_path / "second.err").read_text()
            assert second.returncode == 0, err[-2000:]
            got = json.loads((tmp_path / "second.out").read_text().splitlines()[-1])
            assert got["status"] == "closed" and got["spilled"] == 4
            assert list((state / "spill").iterdir()) == []  # the stale folder, then the round's

            rcid = CID.parse(got["record"])
            record = decode_record(await w.coord_node.get_block(rcid), cid=rcid)
            assert [i.peer for i in record.inputs] == [p.did for p in peers]  # each once
            assert record.run == record_run(state)
            clean = aggregate(
                [g.tensors for g in grads], config.params_for([p.did for p in peers]), samples
            )
            cids = [i.gradient for i in record.inputs]
            meta = aggregate_meta(config.job, 0, "median", cids, run=record.run)
            assert str(file_cid(encode(Gradient(clean, meta)))) == got["output"]

    asyncio.run(go())
