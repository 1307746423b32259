#!/usr/bin/env python3
"""What does a step cost? 64 steps of 1 MiB against 1 step of 64 MiB, same peers, same bytes.

One freshly started isolated Kubo daemon holds everything; the coordinator runs as its own
process (`gradstore coordinator`, a job file with [[steps]]). Each of --peers peers holds a
float32 gradient of --tensors tensors of --mib MiB each (g.l00, g.l01, ...). Two jobs over
the same peers and the same tensors, one round each:

  N steps   one step per tensor (step s00 takes g.l00, ...): N step records, N results
  1 step    one step of every tensor (g.*): one step document per peer

Every peer first stores its documents (one per step it is in), then all peers announce at
once. Measured by the coordinator (its journal), in wall seconds:

  round      from the round's first accepted announcement until its result is published
             (every step closed, the model-level output and the round/5 record stored)
  steps      when each step's result was published, from the same first announcement
             (first, median and last step)

Load-independent beside them: the coordinator's CPU seconds, its Kubo RPC requests by
command (counted by the client, ``GRADSTORE_RPC_COUNTS``), and the Kubo daemon's CPU
seconds from the peers' first announcement to the coordinator's exit, and the peers' (this
process's) CPU seconds from then until every input was verified: all three share the
machine's cores.

The two jobs alternate for --repeat runs; the table gives medians, and the ratio of the
medians is the step overhead (target: at most 1.5x).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m benchmarks steps
    options: --peers 4 --tensors 64 --mib 1 --repeat 3 --method fedavg --json --kubo PATH
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import MiB, emit, kubo_binary, machine, start_daemons, table
from gradstore.coordinator import Journal
from gradstore.dag import CID
from gradstore.format import Gradient
from gradstore.job import JobConfig, parse_job
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, KuboNode, stop_all
from gradstore.node.kubo.counts import ENV as RPC_COUNTS_ENV
from gradstore.peer import Peer

SEED = 20250919
#: Room for a document's header and meta over its tensors' bytes.
HEADER_ROOM = MiB


def names(tensors: int) -> list[str]:
    """The gradient's tensor names: ``g.l00``, ``g.l01``, ... (one layer each)."""
    width = len(str(tensors - 1))
    return [f"g.l{i:0{width}d}" for i in range(tensors)]


def job_raw(
    job: str, coord: SigningKey, peers: list[SigningKey], args: argparse.Namespace, stepped: bool
) -> dict[str, Any]:
    """The job file's tables: one step per tensor (``stepped``) or one step of them all."""
    tensors = names(args.tensors)
    steps = (
        [{"name": f"s{n.removeprefix('g.l')}", "tensors": [n]} for n in tensors]
        if stepped
        else [{"name": "all-tensors", "tensors": ["g.*"]}]
    )
    size = args.tensors * args.mib * MiB  # the model-level output holds every tensor
    return {
        "job": job,
        "coordinator": coord.did,
        "peers": [k.did for k in peers],
        "aggregation": {"method": args.method},
        "rounds": {"count": 1, "quorum": len(peers), "deadline_s": 600.0},
        "limits": {"max_gradient_bytes": size + HEADER_ROOM},
        "steps": steps,
    }


def write_toml(raw: dict[str, Any], path: Path) -> None:
    """``raw`` as a job file (the few value kinds a job file here needs)."""

    def value(v: Any) -> str:
        return json.dumps(v)  # strings, numbers and lists of strings read the same in TOML

    lines = [f"{k} = {value(raw[k])}" for k in ("job", "coordinator", "peers")]
    for table_name in ("aggregation", "rounds", "limits"):
        lines.append(f"[{table_name}]")
        lines += [f"{k} = {value(v)}" for k, v in raw[table_name].items()]
    for step in raw["steps"]:
        lines.append("[[steps]]")
        lines += [f"{k} = {value(v)}" for k, v in step.items()]
    path.write_text("\n".join(lines) + "\n")


def make_gradients(n: int, args: argparse.Namespace) -> list[Gradient]:
    """Each peer's whole gradient: ``--tensors`` seeded float32 tensors of ``--mib`` MiB."""
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(n):
        tensors = {}
        for name in names(args.tensors):
            a = np.empty(args.mib * MiB // 4, dtype=np.float32)
            rng.standard_normal(dtype=np.float32, out=a)
            tensors[name] = a
        out.append(Gradient(tensors))
    return out


async def one_round(
    daemon: KuboDaemon,
    args: argparse.Namespace,
    grads: list[Gradient],
    stepped: bool,
    state: Path,
    repeat: int,
) -> dict[str, Any]:
    """One round of the job (``stepped``: one step per tensor): store, announce, close."""
    coord = SigningKey.from_seed(b"\xc9" * 32)
    keys = [SigningKey.from_seed((i + 1).to_bytes(32, "big")) for i in range(args.peers)]
    label = f"{args.tensors}-steps" if stepped else "1-step"
    raw = job_raw(f"bench-steps-{label}-{repeat}", coord, keys, args, stepped)
    config: JobConfig = parse_job(raw)
    write_toml(raw, state / "job.toml")
    coord.save(state / "coord.key")
    log = open(state / "coordinator.log", "wb")  # noqa: SIM115 (closed in finally)
    profile = (
        ["-m", "cProfile", "-o", str(Path(args.profile) / f"coordinator-{label}-{repeat}.prof")]
        if args.profile
        else []
    )
    process = subprocess.Popen(
        [sys.executable, *profile, "-m", "gradstore", "coordinator",
         "--config", str(state / "job.toml"),
         "--key", str(state / "coord.key"), "--api", daemon.api_url,
         "--state", str(state / "state")],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, RPC_COUNTS_ENV: str(state / "rpc.json")},
    )  # fmt: skip
    node = daemon.node()  # one client: Kubo refuses concurrent publishes from one host
    try:
        async with entered_peers(config, node, keys) as peers:
            stored: list[dict[str, CID]] = []
            t = time.perf_counter()
            for peer, grad in zip(peers, grads, strict=True):
                cids = {}
                for step, part in peer.steps.cut_steps(grad, peer.steps.own()).items():
                    cids[step] = await peer.store.put(peer.prepare(part, 0, 100, step=step))
                stored.append(cids)
            put_s = time.perf_counter() - t
            kubo_cpu, peers_cpu = process_cpu_s(daemon), time.process_time()
            pprof = (
                asyncio.create_task(kubo_profile(daemon, args, f"kubo-{label}-{repeat}.pprof"))
                if args.profile
                else None
            )
            start = time.perf_counter()
            await asyncio.gather(
                *(
                    peer.announce(cid, 0, 100, step=step, timeout=600)
                    for peer, cids in zip(peers, stored, strict=True)
                    for step, cid in cids.items()
                )
            )
            verified_s = time.perf_counter() - start
            if pprof is not None:
                await pprof
            peers_cpu = time.process_time() - peers_cpu
            announcements = sum(peer.announcements_sent for peer in peers)
        code, cpu_s = await asyncio.to_thread(wait_cpu, process)
        kubo_cpu = process_cpu_s(daemon) - kubo_cpu
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
        await node.aclose()
    with Journal(state / "state" / "journal.sqlite") as journal:
        stats = journal.stats(0) or {}
        steps = journal.step_stats(0)
        (row,) = journal.rounds()
        first = min(i.accepted_at for i in journal.inputs(0))
    if code != 0 or stats.get("steps", {}).get("completed") != len(config.steps):
        said = (state / "coordinator.log").read_text(errors="replace")[-2000:]
        raise SystemExit(
            f"{label}: the round did not close every step: exit {code}, {stats}\n{said}"
        )
    requests: dict[str, int] = json.loads((state / "rpc.json").read_text())
    # a step's result is published at the end of its close, open_s after the round opened
    published = sorted(row.opened_at + s["open_s"] + s["close_s"] - first for s in steps.values())
    return {
        "job": label,
        "steps": len(config.steps),
        "put_s": put_s,
        "verified_s": verified_s,
        "round_s": stats["started_s"],
        "first_step_s": published[0],
        "median_step_s": statistics.median(published),
        "last_step_s": published[-1],
        "model_s": stats.get("publish_s"),
        "step_close_s": statistics.median(s["close_s"] for s in steps.values()),
        "announcements_per_input": announcements / sum(len(c) for c in stored),
        "coordinator_cpu_s": cpu_s,
        "requests": requests,
        "kubo_cpu_s": kubo_cpu,
        "peers_cpu_s": peers_cpu,
    }


def process_cpu_s(daemon: KuboDaemon) -> float:
    """The CPU seconds (user + system) the Kubo daemon's process used so far (it serves the
    coordinator's requests, and the peers' announcements and statuses too)."""
    pid = daemon.pid
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def kubo_profile(daemon: KuboDaemon, args: argparse.Namespace, name: str) -> None:
    """Kubo's own CPU profile (Go's pprof, ``go tool pprof``) of the round's first seconds."""
    import httpx

    url = f"{daemon.api_url}/debug/pprof/profile"
    async with httpx.AsyncClient(timeout=60) as client:
        answer = await client.get(url, params={"seconds": str(args.profile_s)})
    (Path(args.profile) / name).write_bytes(answer.content)


def wait_cpu(process: subprocess.Popen[bytes]) -> tuple[int, float]:
    """Wait for ``process`` to exit: its exit code and the CPU seconds it used (user + system),
    a figure the machine's other load inflates far less than wall time."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime


@contextlib.asynccontextmanager
async def entered_peers(
    config: JobConfig, node: KuboNode, keys: list[SigningKey]
) -> AsyncIterator[list[Peer]]:
    """Every peer entered over the one daemon's client (which serializes publishes, as Kubo
    needs), all hearing the coordinator through the first one's subscription (as
    bench_round's peers do: the bench process decodes each status once, not once per peer,
    so it measures the coordinator)."""
    async with contextlib.AsyncExitStack() as stack:
        # the coordinator's process starts beside them: at load 10 its imports alone took
        # over the peers' default 15 s of patience, and the run ended there
        patience = 120.0
        first = await stack.enter_async_context(
            Peer(config, node, keys[0], coordinator_timeout_s=patience)
        )
        peers = [first]
        for key in keys[1:]:
            peers.append(
                await stack.enter_async_context(
                    Peer(config, node, key, listener=first, coordinator_timeout_s=patience)
                )
            )
        yield peers


def report(data: dict[str, Any]) -> str:
    runs = data["runs"]
    rows = []
    medians: dict[str, float] = {}
    cpu: dict[str, float] = {}
    counts: dict[str, str] = {}
    for label in (f"{data['tensors']}-steps", "1-step"):
        mine = [r for r in runs if r["job"] == label]
        med = {k: statistics.median(r[k] for r in mine) for k in mine[0] if k.endswith("_s")}
        medians[label] = med["round_s"]
        cpu[label] = statistics.median(r["coordinator_cpu_s"] for r in mine)
        size = data["mib"] * (1 if label != "1-step" else data["tensors"])
        rows.append(
            [
                f"{mine[0]['steps']} step(s) of {size} MiB",
                f"{med['round_s']:.3f}",
                " ".join(f"{r['round_s']:.2f}" for r in mine),
                f"{med['first_step_s']:.3f} / {med['median_step_s']:.3f} / {med['last_step_s']:.3f}",
                f"{med['step_close_s']:.3f}",
                f"{med['model_s']:.3f}",
                f"{med['verified_s']:.3f}",
                f"{statistics.median(r['announcements_per_input'] for r in mine):.2f}",
                f"{statistics.median(r['coordinator_cpu_s'] for r in mine):.1f}",
                f"{statistics.median(sum(r['requests'].values()) for r in mine):.0f}",
                f"{statistics.median(r['kubo_cpu_s'] for r in mine):.1f}",
                f"{statistics.median(r['peers_cpu_s'] for r in mine):.1f}",
            ]
        )
        counts[label] = requests_line(mine)
    many = f"{data['tensors']}-steps"
    ratio = medians[many] / medians["1-step"]
    cpu_ratio = cpu[many] / cpu["1-step"]
    head = (
        f"{data['peers']} peers x {data['tensors']} x {data['mib']} MiB float32, method "
        f"{data['method']}, one Kubo {data['kubo']} daemon, coordinator in its own process, "
        f"{data['repeat']} runs each (medians), load {data['machine']['loadavg']}"
    )
    body = table(
        [
            "job",
            "round s",
            "runs",
            "step published: first / median / last",
            "step close",
            "model+record",
            "peers verified",
            "announcements / input",
            "coordinator CPU s",
            "Kubo requests",
            "Kubo CPU s",
            "peers CPU s",
        ],
        rows,
    )
    by_command = "\n".join(f"  {label}: {line}" for label, line in counts.items())
    return (
        f"{head}\n\n{body}\n\ncoordinator's Kubo requests by command (medians):\n"
        f"{by_command}\n\nstep overhead: {ratio:.2f}x the time (target <= 1.5x), "
        f"{cpu_ratio:.2f}x the coordinator's CPU"
    )


def requests_line(runs: list[dict[str, Any]]) -> str:
    """The coordinator's Kubo requests by command, medians over ``runs``, most first."""
    commands = {c for r in runs for c in r["requests"]}
    med = {c: statistics.median(r["requests"].get(c, 0) for r in runs) for c in commands}
    return ", ".join(f"{c} {n:.0f}" for c, n in sorted(med.items(), key=lambda cn: -cn[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--tensors", type=int, default=64, help="tensors, and steps (default 64)")
    parser.add_argument("--mib", type=int, default=1, help="MiB per tensor (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each job (default 3)")
    parser.add_argument("--method", default="fedavg")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run the coordinator under cProfile, its stats in DIR, and take Kubo's pprof "
        "CPU profile of the round's first --profile-s seconds there too",
    )
    parser.add_argument("--profile-s", type=int, default=3, help="seconds of Kubo's profile")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--kubo", help="Kubo binary (default: $GRADSTORE_KUBO, PATH, cache)")
    args = parser.parse_args()
    grads = make_gradients(args.peers, args)
    (daemon,) = start_daemons(kubo_binary(args.kubo), 1)
    runs = []
    try:
        version = daemon.run("version", "--number").stdout.decode().strip()
        for repeat in range(args.repeat):
            for stepped in (True, False) if repeat % 2 == 0 else (False, True):
                with tempfile.TemporaryDirectory(prefix="gradstore-bench-steps-") as tmp:
                    runs.append(
                        asyncio.run(one_round(daemon, args, grads, stepped, Path(tmp), repeat))
                    )
    finally:
        stop_all([daemon])
    data = {
        "peers": args.peers,
        "tensors": args.tensors,
        "mib": args.mib,
        "repeat": args.repeat,
        "method": args.method,
        "kubo": version,
        "machine": machine(),
        "runs": runs,
    }
    emit(data, args.json, report)


if __name__ == "__main__":
    main()
