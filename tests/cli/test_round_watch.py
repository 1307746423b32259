"""``gradstore round status`` and ``gradstore round list`` against a real coordinator on real
Kubo daemons (issue 24, item 3), for a job without steps and a stepped one.

The commands run in-process in a worker thread (their own event loop and node client), while
the coordinator and the peers run on the test's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.dag import CID
from gradstore.errors import RefusedError
from gradstore.format import Gradient
from gradstore.messages import (
    Result,
    Status,
    decode_record,
    encode_message,
    encode_record,
)
from gradstore.node import KuboDaemon, follow
from gradstore.peer import Peer

from ..coordinator.harness import (
    World,
    gradients,
    key,
    make_job,
    publish_all,
    start_coordinator,
    wait_subscribed,
    world,
    write_job_toml,
)
from ..coordinator.steps_harness import step_gradients, stepped_job
from .conftest import Cli
from .helpers import Run

pytestmark = [pytest.mark.kubo, pytest.mark.slow]

OTHER = key(55)  # not the job's coordinator


def _job_toml_with_steps(w: World, path: Path) -> Path:
    """``write_job_toml`` and the job's ``[[steps]]``."""
    write_job_toml(w.config, path)
    text = path.read_text()
    for step in w.config.steps:
        tensors = ", ".join(f'"{t}"' for t in step.tensors)
        text += (
            f'[[steps]]\nname = "{step.name}"\ntensors = [{tensors}]\nquorum = {step.quorum}\n'
            f'method = "{step.aggregation.method}"\ndeadline_s = {step.deadline_s}\n'
        )
    path.write_text(text)
    return path


async def _in_thread(cli: Cli, *argv: object) -> Run:
    """The command in a worker thread (it runs its own event loop)."""
    return await asyncio.to_thread(cli, *argv)


@contextlib.asynccontextmanager
async def _injecting(w: World, messages: list[bytes]) -> AsyncIterator[list[bytes]]:
    """Publish ``messages`` on the results topic every 0.2 s until the block ends; yields
    what a plain subscription on the same node heard of them (they did go out)."""
    node = w.peer_nodes[0]
    heard: list[bytes] = []
    async with node.subscribe(w.config.results_topic) as sub:

        async def hear() -> None:
            async for msg in follow(node, sub):
                if msg.data in messages:
                    heard.append(msg.data)

        async def send() -> None:
            while True:
                for data in messages:
                    await node.publish(w.config.results_topic, data)
                await asyncio.sleep(0.2)

        tasks = [asyncio.create_task(hear()), asyncio.create_task(send())]
        try:
            yield heard
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _hostile(w: World, run: str, round_: int, step: str | None, until: int) -> list[bytes]:
    """A forged status and result (signed by another key, stamped ahead so that, if shown,
    they would stay the newest), and a replayed one (the coordinator's own signature,
    stamped ``until`` - 2 s: before the command started): each says the round failed or
    closed, which it did not."""
    roster = w.config.roster
    nobody = roster.bitmap([])
    status = Status(w.config.job, run, round_, step=step, received=nobody, verified=nobody,
                    refused=nobody, reasons=(), sent_at=int(time.time() * 1000) + 30_000,
                    failed="forged: the round failed")  # fmt: skip
    result = Result(w.config.job, run, round_, step=step, cid=str(CID.parse(FAKE_OUTPUT)),
                    record=str(CID.parse(FAKE_RECORD)), method="forged",
                    peers=roster.bitmap(w.config.peers), sent_at=status.sent_at)  # fmt: skip
    replayed = replace(status, sent_at=until - 2000, failed="replayed: the round failed")
    return [
        encode_message(status, OTHER),
        encode_message(result, OTHER),
        encode_message(replayed, w.coord_key),
    ]


FAKE_OUTPUT = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
FAKE_RECORD = "bafyreigbtj4x7ip5legnfznufuopl4sg4knzc2cof6duas4b3q2fy6swua"


def _no_hostile_text(*texts: str) -> None:
    for text in texts:
        for word in ("forged", "replayed", FAKE_OUTPUT, FAKE_RECORD):
            assert word not in text, text


async def _publish(w: World, i: int, gradient: Gradient, round_: int, step: str | None) -> str:
    """Peer ``i`` publishes; returns its CID, or ``refused: REASON``."""
    async with Peer(w.config, w.peer_nodes[i], w.peer_keys[i], first_backoff_s=0.3) as peer:
        try:
            return str(await peer.publish(gradient, round_, 1 + i, step=step, timeout=30))
        except RefusedError as exc:
            return f"refused: {exc.reason}"


def _nan(gradient: Gradient) -> Gradient:
    name, array = next(iter(gradient.tensors.items()))
    bad = np.array(array, copy=True)
    bad.flat[0] = np.nan
    return Gradient({**gradient.tensors, name: bad})


def test_round_status_and_list_of_a_job_without_steps(
    cli: Cli, kubo_factory: Callable[..., list[KuboDaemon]], tmp_path: Path
) -> None:
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = make_job(3, rounds=2, quorum=2, deadline_s=60.0)
    dids = [k.did for k in keys]
    job = write_job_toml(config, tmp_path / "job.toml")
    api = ["--api", daemons[1].api_url]

    async def go() -> dict[str, Any]:
        async with world(daemons, config, coord, keys) as w:
            coordinator, task = start_coordinator(w, tmp_path / "state")
            try:
                await wait_subscribed(w)
                async with Peer(config, w.peer_nodes[0]) as listener:
                    await publish_all(w, 0, gradients(3, 0), [1, 2, 3])
                    first = await listener.await_result(0, timeout=30)
                # round 1: peer 0 verified, peer 1 refused, peer 2 not there (yet)
                good = gradients(3, 1)
                sent_ms = int(time.time() * 1000)
                sent = [await _publish(w, 0, good[0], 1, None),
                        await _publish(w, 1, _nan(good[1]), 1, None)]  # fmt: skip
                start_ms = int(time.time() * 1000)
                hostile = _hostile(w, coordinator.run_id, 1, None, start_ms)
                async with _injecting(w, hostile) as heard:
                    text = await _in_thread(cli, "round", "status", "--config", job, *api)
                    as_json = await _in_thread(
                        cli, "round", "status", "--config", job, "--json", *api
                    )
                listed = await _in_thread(cli, "round", "list", "--config", job, *api)
                # watch while the last peer publishes: the job completes and the watch ends
                watch = asyncio.create_task(
                    _in_thread(cli, "round", "status", "--config", job, "--watch", "--json", *api)
                )
                await asyncio.sleep(4)  # the watch prints round 1 open first
                sent.append(await _publish(w, 2, good[2], 1, None))
                watched = await asyncio.wait_for(watch, 60)
                await asyncio.wait_for(task, 30)
                return {"first": first, "sent": sent, "text": text, "json": as_json,
                        "heard": heard, "listed": listed, "watched": watched,
                        "hostile": hostile, "sent_ms": sent_ms}  # fmt: skip
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    out = asyncio.run(go())
    first = out["first"]
    assert out["sent"][1] == "refused: non-finite: tensor 'w' holds NaN or Inf"
    assert set(out["heard"]) == set(out["hostile"])  # the hostile messages did go out
    # round status, text: round 1 open, each peer's state, and round 0's CIDs
    text = out["text"]
    assert text.code == 0 and text.err == "", text.err
    lines = text.out.splitlines()
    assert lines[0].startswith("job test-job, run ") and lines[0].endswith(": round 1 of 2 open")
    # the deadline as the coordinator's signed status says it (its clock runs since peer 0)
    assert re.fullmatch(r"  1/3 verified, quorum 2, deadline \d\d:\d\d:\d\d UTC", lines[1]), lines[
        1
    ]
    states = {line.split()[1]: line.split(None, 2) for line in lines[2:5]}
    assert states[dids[0]][0] == "verified" and states[dids[2]][0] == "absent"
    assert states[dids[1]] == ["refused", dids[1], "non-finite: tensor 'w' holds NaN or Inf"]
    assert lines[5] == (
        f"last: round 0 closed, aggregate {first.cid} record {first.record} (fedavg, 3 peer(s))"
    )
    _no_hostile_text(text.out, out["json"].out)  # neither forged nor replayed messages show
    # --json: the same, in the README's shape
    doc = json.loads(out["json"].out)
    assert doc["heard"] is True and doc["complete"] is False and doc["rounds"] == 2
    (step,) = doc["open"]["steps"]
    assert doc["open"]["round"] == 1 and step["step"] is None and step["state"] == "open"
    assert (step["verified"], step["expected"], step["quorum"]) == (1, 3, 2)
    assert 0 < step["deadline_at_ms"] - out["sent_ms"] <= 60_000 + 5_000
    assert [(p["peer"], p["state"]) for p in step["peers"]] == [
        (dids[0], "verified"), (dids[1], "refused"), (dids[2], "absent"),
    ]  # fmt: skip
    assert doc["last"] == {"round": 0, "state": "closed", "output": str(first.cid),
                           "record": str(first.record), "method": "fedavg", "peers": 3,
                           "reason": None}  # fmt: skip
    # round list --config: the record of the last round the coordinator says closed
    listed = out["listed"]
    assert listed.code == 0, listed.err
    header, row = listed.out.splitlines()
    assert header.split() == ["ROUND", "RECORD", "OUTPUT", "METHOD", "PEERS", "STEPS"]
    assert row.split() == ["0", str(first.record), str(first.cid), "fedavg", "3", "-"]
    # --watch --json: JSON lines, from round 1 open to the job complete
    watched = out["watched"]
    assert watched.code == 0, watched.err
    docs = [json.loads(line) for line in watched.out.splitlines()]
    assert docs[0]["open"]["round"] == 1 and docs[0]["last"]["round"] == 0
    assert docs[-1]["complete"] is True and docs[-1]["open"] is None
    last = docs[-1]["last"]
    assert (last["round"], last["state"], last["peers"]) == (1, "closed", 2)
    changes = [{k: v for k, v in d.items() if k != "at_ms"} for d in docs]
    assert all(a != b for a, b in itertools.pairwise(changes))  # a line per change
    _check_list(cli, api, job, last["record"], str(first.record), tmp_path, dids)


def _check_list(
    cli: Cli, api: list[str], job: Path, head: str, first: str, tmp_path: Path, dids: list[str]
) -> None:
    """round list from a head CID: --json, --limit, no --config; a head signed by another
    key is refused with --config, and without it when its prev is the coordinator's."""
    r = cli("round", "list", head, "--config", job, "--json", *api)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["head"] == head and doc["job"] == "test-job"
    assert [(x["round"], x["record"], x["type"]) for x in doc["rounds"]] == [
        (1, head, "gradstore/round/4"), (0, first, "gradstore/round/4"),
    ]  # fmt: skip
    assert doc["rounds"][0]["prev"] == first and doc["rounds"][1]["prev"] is None
    assert doc["rounds"][0]["peers"] == sorted([dids[0], dids[2]])
    assert doc["rounds"][0]["steps"] is None and doc["rounds"][0]["method"] == "fedavg"
    r = cli("round", "list", head, "--limit", "1", *api)
    assert r.code == 0 and [line.split()[0] for line in r.out.splitlines()] == ["ROUND", "1"]
    # a record another key signed, linking the coordinator's: refused either way
    forged = _forged_head(head, api[1])
    line = cli("round", "list", forged, "--config", job, *api).one_error_line()
    assert f"not by the expected coordinator {key(100).did}" in line, line
    line = cli("round", "list", forged, *api).one_error_line()
    assert f"{head} (round 1) is signed by {key(100).did}" in line, line


def _forged_head(head: str, api: str) -> str:
    """A round 2 record signed by ``OTHER`` whose prev is ``head``, stored on the node."""
    from gradstore.node import connect

    async def go() -> str:
        node = connect(api)
        try:
            record = decode_record(await node.get_block(CID.parse(head)), cid=CID.parse(head))
            forged = replace(record, round=2, prev=CID.parse(head), coordinator=OTHER.did)
            cid, data = encode_record(forged, OTHER)
            await node.put_block(data, cid.codec)
            return str(cid)
        finally:
            await node.aclose()

    return asyncio.run(go())


def test_round_status_and_list_of_a_stepped_job(
    cli: Cli, kubo_factory: Callable[..., list[KuboDaemon]], tmp_path: Path
) -> None:
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job(
        body={"deadline_s": 60.0}
    )  # head: median of 3; body: quorum 2
    dids = [k.did for k in keys]
    api = ["--api", daemons[1].api_url]
    grads = step_gradients(3, 0)

    async def go() -> dict[str, Any]:
        async with world(daemons, config, coord, keys) as w:
            job = _job_toml_with_steps(w, tmp_path / "job.toml")
            coordinator, task = start_coordinator(w, tmp_path / "state")
            try:
                await wait_subscribed(w)
                async with Peer(config, w.peer_nodes[0]) as listener:
                    await asyncio.gather(
                        *(_publish(w, i, grads[i]["head"], 0, "head") for i in range(3))
                    )
                    head = await listener.await_result(0, step="head", timeout=30)
                sent = [await _publish(w, 0, grads[0]["body"], 0, "body"),
                        await _publish(w, 1, _nan(grads[1]["body"]), 0, "body")]  # fmt: skip
                hostile = _hostile(w, coordinator.run_id, 0, "body", int(time.time() * 1000))
                async with _injecting(w, hostile):
                    text = await _in_thread(cli, "round", "status", "--config", job, *api)
                    as_json = await _in_thread(
                        cli, "round", "status", "--config", job, "--json", *api
                    )
                watch = asyncio.create_task(
                    _in_thread(cli, "round", "status", "--config", job, "--watch", *api)
                )
                await asyncio.sleep(4)
                sent.append(await _publish(w, 2, grads[2]["body"], 0, "body"))
                watched = await asyncio.wait_for(watch, 60)
                await asyncio.wait_for(task, 30)
                return {"head": head, "sent": sent, "text": text, "json": as_json,
                        "watched": watched, "job": job}  # fmt: skip
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    out = asyncio.run(go())
    head = out["head"]
    assert out["sent"][1].startswith("refused: non-finite")
    text = out["text"]
    assert text.code == 0 and text.err == "", text.err
    lines = text.out.splitlines()
    assert lines[0].endswith(": round 0 of 1 open")
    assert lines[1] == (
        f"  step head: closed, 3/3 aggregated, aggregate {head.cid} record {head.record}"
    )
    assert [line.split()[0] for line in lines[2:5]] == ["aggregated"] * 3
    assert re.fullmatch(  # the signed deadline of the step, on the round's clock
        r"  step body: open, 1/3 verified, quorum 2, deadline \d\d:\d\d:\d\d UTC", lines[5]
    ), lines[5]
    body = {line.split()[1]: line.split(None, 2) for line in lines[6:9]}
    assert body[dids[0]][0] == "verified" and body[dids[2]][0] == "absent"
    assert body[dids[1]][0] == "refused" and body[dids[1]][2].startswith("non-finite: ")
    assert len(lines) == 9  # no round has ended yet
    _no_hostile_text(text.out, out["json"].out)
    doc = json.loads(out["json"].out)
    assert [(s["step"], s["state"], s["verified"], s["quorum"]) for s in doc["open"]["steps"]] == [
        ("head", "closed", 3, 3), ("body", "open", 1, 2),
    ]  # fmt: skip
    assert doc["open"]["steps"][0]["record"] == str(head.record) and doc["last"] is None
    # --watch (text): a block per change, each headed by the time; the last: the job complete
    watched = out["watched"]
    assert watched.code == 0, watched.err
    blocks = watched.out.split("\n\n")
    assert blocks[0].splitlines()[0].endswith(": round 0 of 1 open")
    final = blocks[-1].splitlines()
    assert final[0].endswith(": complete (1 round(s))"), final
    assert final[1].startswith("last: round 0 closed, aggregate ") and final[1].endswith(
        "(median+fedavg, 3 peer(s))"
    )
    record = final[1].split(" record ")[1].split()[0]
    # round list: the round/5 record, its steps' records, methods and peers
    r = cli("round", "list", record, "--config", out["job"], "--json", *api)
    assert r.code == 0, r.err
    (listed,) = json.loads(r.out)["rounds"]
    assert listed["type"] == "gradstore/round/5" and listed["method"] == "median+fedavg"
    assert listed["peers"] == sorted(dids)
    assert [(s["step"], s["state"], s["method"], len(s["peers"])) for s in listed["steps"]] == [
        ("head", "closed", "median", 3), ("body", "closed", "fedavg", 2),
    ]  # fmt: skip
    assert listed["steps"][0]["record"] == str(head.record)
    r = cli("round", "list", record, *api)
    assert r.code == 0 and r.out.splitlines()[1].split()[-1] == "head,body", r.out


def test_round_status_without_a_coordinator_says_so(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path
) -> None:
    config, _, _ = make_job(2)
    job = write_job_toml(config, tmp_path / "job.toml")
    started = time.monotonic()
    r = cli("round", "status", "--config", job, "--api", kubo.api_url)
    assert r.code == 0 and r.err == ""
    assert r.out.splitlines() == [
        "job test-job: no coordinator heard on gradstore/v1/test-job/results within 3 s (is "
        "`gradstore coordinator` running, and connected to this node?)"
    ]
    assert 3 <= time.monotonic() - started < 10
    r = cli("round", "status", "--config", job, "--json", "--api", kubo.api_url)
    assert json.loads(r.out)["heard"] is False
    line = cli("round", "list", "--config", job, "--api", kubo.api_url).one_error_line()
    assert "no coordinator of job test-job heard" in line and "head record's CID" in line


def test_round_list_needs_a_head_or_a_job(cli: Cli) -> None:
    line = cli("round", "list", "--api", "http://127.0.0.1:9").one_error_line(2)
    assert line == "error: give the head record's CID, or --config job.toml to ask the coordinator"
