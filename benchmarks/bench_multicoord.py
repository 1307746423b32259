#!/usr/bin/env python3
"""A round split among coordinators by steps: --coordinators coordinators against 1, same job.

Each of --peers peers holds a float32 gradient of --kib KiB cut into --steps tensors of the
same size (g.l0, g.l1, ...), one step each (s0 takes g.l0, ...). Two jobs, one round each,
the same peers, documents and steps, alternating for --repeat runs:

  split    step s is owned by coordinator s mod --coordinators ([[steps]] coordinator); the
           first is the job's coordinator (the root), which also combines the round
  single   every step owned by one coordinator

Every coordinator runs as its own process (`gradstore coordinator`) on a Kubo daemon of its
own; the peers share two more daemons (one node client per 16 peers, as `round` does).
Every peer first stores its step documents, then all announce every step at once and wait
until the step's owner verified it. Measured:

  total      from the first announcement until a listening peer holds the root's signed
             round result (every step closed or failed, the round/5 record stored)
  round      the root's journal: from the round's first accepted announcement to its end
  CPU        each coordinator process's user+system seconds (/proc), the busiest and the sum

With --tree, the round is split by peer groups in a two-level tree instead (docs/design/
multicoord.md, "The tree by peer groups"): --coordinators leaves, each the leaf of an equal
share of the peers ([[groups]]), and a root that combines their exact partial sums; against
1 coordinator of the same peers, no steps (one tensor per peer), both with fedavg and
accumulate = "exact" (the same output CID). Every leaf and the root are processes of their
own on Kubo daemons of their own.

The ratios are split / single: below 1 the split pays. On one machine every coordinator and
daemon shares its cores, so the wall-time ratio is what a machine of this many cores gives,
not what one machine per coordinator gives; the busiest coordinator's CPU is the figure that
carries over to one machine each.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m benchmarks multicoord
    options: --peers 1000 --kib 16 --steps 4 --coordinators 4 --repeat 1 --json --kubo PATH
             --tree (4 leaves and a root against 1 coordinator)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import emit, kubo_binary, machine, start_daemons, table
from gradstore.cli._exit import INTERRUPTED
from gradstore.coordinator import Journal
from gradstore.format import Gradient
from gradstore.job import JobConfig, parse_job
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, KuboNode, stop_all
from gradstore.peer import Peer

SEED = 20261203
#: Peers per Kubo node client (each client holds a connection pool of its own).
PER_CLIENT = 16
#: Announcements in flight at once: 1,000 at once through two daemons failed with Kubo's
#: "validation ignored" at 1,000 peers (--tree, 2026-12-06); 250 passed.
ANNOUNCING = 250


def coordinator_keys(n: int) -> list[SigningKey]:
    return [SigningKey.from_seed(bytes([0xC0 + i]) * 32) for i in range(n)]


def peer_keys(n: int) -> list[SigningKey]:
    keys = (SigningKey.from_seed((i + 1).to_bytes(32, "big")) for i in range(n))
    return sorted(keys, key=lambda k: k.did)


def make_job(name: str, args: argparse.Namespace, owners: list[SigningKey]) -> dict[str, Any]:
    """The job file's content: step s owned by ``owners[s % len(owners)]``, the first the root."""
    steps = []
    for s in range(args.steps):
        step: dict[str, Any] = {"name": f"s{s}", "tensors": [f"g.l{s}"]}
        owner = owners[s % len(owners)]
        if owner.did != owners[0].did:
            step["coordinator"] = owner.did
        steps.append(step)
    return {
        "job": name,
        "coordinator": owners[0].did,
        "peers": [k.did for k in peer_keys(args.peers)],
        "aggregation": {"method": args.method},
        # rounds without end: every coordinator stays (and repeats the round's result) until
        # the benchmark has it and stops them; a last round's linger of 3 s is too short for
        # a peer that re-announced late on a loaded machine
        "rounds": {"count": 0, "quorum": args.peers, "deadline_s": 600.0},
        "steps": steps,
    }


def make_tree_job(name: str, args: argparse.Namespace, owners: list[SigningKey]) -> dict[str, Any]:
    """A tree job: ``owners[0]`` the root, each other owner the leaf of an equal share of
    the peers (in roster order); one owner: the same job flat. fedavg accumulated exactly."""
    dids = [k.did for k in peer_keys(args.peers)]
    raw: dict[str, Any] = {
        "job": name,
        "coordinator": owners[0].did,
        "peers": dids,
        "aggregation": {"method": "fedavg", "accumulate": "exact"},
        "rounds": {"count": 0, "quorum": args.peers, "deadline_s": 600.0},
        "steps": [],
    }
    leaves = owners[1:]
    if leaves:
        raw["groups"] = [
            {"name": f"g{j}", "coordinator": leaf.did, "peers": dids[j :: len(leaves)]}
            for j, leaf in enumerate(leaves)
        ]
    return raw


def job_toml(raw: dict[str, Any]) -> str:
    """``raw`` as a TOML job file."""

    def value(v: Any) -> str:
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = [f"{k} = {value(raw[k])}" for k in ("job", "coordinator", "peers")]
    for name in ("aggregation", "rounds"):
        lines += [f"[{name}]", *(f"{k} = {value(v)}" for k, v in raw[name].items())]
    for step in raw["steps"]:
        lines += ["[[steps]]", *(f"{k} = {value(v)}" for k, v in step.items())]
    for group in raw.get("groups", []):
        lines += ["[[groups]]", *(f"{k} = {value(v)}" for k, v in group.items())]
    return "\n".join(lines) + "\n"


def make_gradients(args: argparse.Namespace) -> list[Gradient]:
    rng = np.random.default_rng(SEED)
    each = args.kib * 1024 // 4 // args.steps
    return [
        Gradient(
            {f"g.l{s}": rng.standard_normal(each, dtype=np.float32) for s in range(args.steps)}
        )
        for _ in range(args.peers)
    ]


def cpu_seconds(pid: int) -> float:
    """A live process's user + system CPU seconds (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_round(
    daemons: list[KuboDaemon],
    args: argparse.Namespace,
    grads: list[Gradient],
    owners: list[SigningKey],
    tmp: Path,
) -> dict[str, Any]:
    """One round of the job ``owners`` split (one owner: not split); its timings."""
    name = f"bench-mc-{len(owners)}-{tmp.name.rsplit('-', 1)[-1]}"
    raw = (make_tree_job if args.tree else make_job)(name, args, owners)
    if not raw["steps"]:
        del raw["steps"]
    config: JobConfig = parse_job(raw)
    (tmp / "job.toml").write_text(job_toml({"steps": [], **raw}))
    keys = peer_keys(args.peers)
    procs: list[subprocess.Popen[bytes]] = []
    peer_daemons = daemons[-2:]
    carriers = [d.node() for d in peer_daemons]
    clients = [
        peer_daemons[j % 2].node() for j in range((args.peers + PER_CLIENT - 1) // PER_CLIENT)
    ]
    nodes: list[KuboNode] = [clients[i // PER_CLIENT] for i in range(args.peers)]
    try:
        for c, key in enumerate(owners):  # the root first: the others wait for its run
            key.save(tmp / f"c{c}.key")
            log = open(tmp / f"c{c}.log", "wb")  # noqa: SIM115 (the process holds it)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gradstore", "coordinator",
                     "--config", str(tmp / "job.toml"), "--key", str(tmp / f"c{c}.key"),
                     "--api", daemons[c].api_url, "--state", str(tmp / f"state{c}"), "-v"],
                    stdout=log, stderr=subprocess.STDOUT,
                )
            )  # fmt: skip
            log.close()
        views = [config.group_view(g.name) for g in config.groups]
        for carrier in carriers:  # pubsub reaches only peers the publisher knows are subscribed
            if views:  # a tree: each leaf reads its group's gradients topic, the root the results
                for view in views:
                    await carrier.wait_for_topic_peers(view.gradients_topic, 1, timeout=120)
                    await carrier.wait_for_topic_peers(view.results_topic, 1, timeout=120)
                continue
            # every coordinator reads the gradients topic; split, each also hears the others
            topics = [config.gradients_topic] + ([config.results_topic] if len(owners) > 1 else [])
            for topic in topics:
                await carrier.wait_for_topic_peers(topic, len(owners), timeout=120)
        steps: list[str | None] = [s.name for s in config.steps] if config.stepped else [None]
        async with contextlib.AsyncExitStack() as hubs_stack:
            # a tree's peers hear their group's leaf and the root's result there: one listener
            # per group (keyless, its view), shared by its peers
            hubs = {
                v.group: await hubs_stack.enter_async_context(
                    Peer(v, nodes[0], coordinator_timeout_s=120)
                )
                for v in views
            }
            listener = await hubs_stack.enter_async_context(  # the root's round result
                Peer(config, nodes[0], coordinator_timeout_s=120)
            )
            for hub in (listener, *hubs.values()):
                while hub.run is None:  # the (leaf's or root's) first status: the run is known
                    await asyncio.sleep(0.1)
            peers = [
                Peer(
                    config,
                    nodes[i],
                    keys[i],
                    listener=hubs[config.group_of(keys[i].did).name] if views else listener,
                    coordinator_timeout_s=120,
                )
                for i in range(args.peers)
            ]
            for peer in peers:
                await peer.__aenter__()
            try:
                putting = asyncio.Semaphore(32)

                async def put(i: int, step: str | None) -> Any:
                    async with putting:
                        return await peers[i].store.put(
                            peers[i].prepare(grads[i], 0, 100 + i, step=step)
                        )

                cids = await asyncio.gather(*(put(i, s) for i in range(args.peers) for s in steps))
                start = time.perf_counter()
                say(f"{len(owners)} coordinator(s): {len(cids)} documents stored, announcing")
                # at most ANNOUNCING announcements in flight: 4,000 at once through two daemons
                # overflow their pubsub validation queues ("validation ignored")
                announcing = asyncio.Semaphore(ANNOUNCING)

                async def announce(i: int, j: int, step: str | None) -> None:
                    async with announcing:
                        await peers[i].announce(
                            cids[i * len(steps) + j], 0, 100 + i, step=step, timeout=600
                        )

                await asyncio.gather(
                    *(announce(i, j, s) for i in range(args.peers) for j, s in enumerate(steps))
                )
                say(f"every input verified after {time.perf_counter() - start:.1f} s")
                result = await listener.await_result(0, timeout=600)
                total = time.perf_counter() - start
                say(f"the round's result after {total:.1f} s")
                cpu = [cpu_seconds(p.pid) for p in procs]  # they wait in round 1
                sent = sum(p.announcements_sent for p in peers)
            finally:
                for peer in peers:
                    await peer.__aexit__(None, None, None)
        for p in procs:
            p.send_signal(signal.SIGTERM)  # a clean stop: round 1 stays open in the journal
        codes = [await asyncio.to_thread(p.wait, 120) for p in procs]
        with Journal(tmp / "state0" / "journal.sqlite") as journal:
            stats = journal.stats(0) or {}
        if any(code != INTERRUPTED for code in codes) or len(result.peers) != args.peers:
            raise SystemExit(f"the round did not close with every peer: exits {codes}, {stats}")
        return {
            "total_s": total,
            "round_s": stats.get("started_s"),
            "cpu_s": cpu,
            "cpu_max_s": max(cpu),
            "cpu_sum_s": sum(cpu),
            "announcements": sent,
            "output": str(result.cid),
            "leaves": len(views),
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for node in (*carriers, *clients):
            await node.aclose()


def say(line: str) -> None:
    """A progress line on stderr (the report goes to stdout)."""
    print(line, file=sys.stderr, flush=True)


def report(data: dict[str, Any]) -> str:
    split, single = data["split"], data["single"]

    def med(runs: list[dict[str, Any]], key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    rows = []
    round_label = (  # a tree's root hears no announcement: its clock starts at a leaf's word
        "round (journals: first word to end)"
        if data.get("tree")
        else "round (root: first announcement to end)"
    )
    for label, key in (
        ("total (a peer holds the round's result)", "total_s"),
        (round_label, "round_s"),
        ("CPU, busiest coordinator", "cpu_max_s"),
        ("CPU, all coordinators", "cpu_sum_s"),
    ):
        a, b = med(split, key), med(single, key)
        rows.append([label, f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}x"])
    mib = data["peers"] * data["kib"] / 1024
    shape = (
        f"a tree of {data['coordinators']} leaves and a root against 1 coordinator, fedavg "
        "accumulated exactly"
        if data.get("tree")
        else f"{data['steps']} steps, {data['coordinators']} coordinators against 1, "
        f"method {data['method']}"
    )
    head = (
        f"{data['peers']} peers x {data['kib']} KiB float32 ({mib:.1f} MiB), {shape}, "
        f"median of {data['repeat']}; Kubo {data['kubo']}, {os.cpu_count()} cores, "
        f"load {data['machine']['loadavg']}"
    )
    headers = ["seconds", f"{data['coordinators']} coordinators", "1 coordinator", "ratio"]
    return head + "\n\n" + table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--peers", type=int, default=1000)
    parser.add_argument("--kib", type=int, default=16, help="gradient size per peer in KiB")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--coordinators", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--method", default="fedavg")
    parser.add_argument(
        "--tree",
        action="store_true",
        help="split by peer groups: --coordinators leaves and a root, fedavg accumulated exactly",
    )
    parser.add_argument("--keep", help="keep each run's coordinator logs and state in this folder")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--kubo", help="Kubo binary (default: $GRADSTORE_KUBO, PATH, cache)")
    args = parser.parse_args()
    if args.tree:
        args.steps, args.method = 1, "fedavg"  # one tensor per peer: no steps in a tree job
    elif args.coordinators > args.steps:
        parser.error("--coordinators must not exceed --steps (each owns a step)")
    grads = make_gradients(args)
    owners = coordinator_keys(args.coordinators + (1 if args.tree else 0))  # + the root
    daemons = start_daemons(kubo_binary(args.kubo), len(owners) + 2, connect=True)
    runs: dict[str, list[dict[str, Any]]] = {"split": [], "single": []}
    try:
        version = daemons[0].run("version", "--number").stdout.decode().strip()
        for _ in range(args.repeat):
            for mode, keys in (("single", owners[:1]), ("split", owners)):
                if args.keep:  # every coordinator's log and state stays there
                    kept = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=args.keep))
                    runs[mode].append(asyncio.run(one_round(daemons, args, grads, keys, kept)))
                    continue
                with tempfile.TemporaryDirectory(prefix=f"gradstore-bench-mc-{mode}-") as tmp:
                    runs[mode].append(asyncio.run(one_round(daemons, args, grads, keys, Path(tmp))))
    finally:
        stop_all(daemons)
    data = {
        "peers": args.peers,
        "kib": args.kib,
        "steps": args.steps,
        "coordinators": args.coordinators,
        "tree": args.tree,
        "repeat": args.repeat,
        "method": args.method,
        "kubo": version,
        "machine": machine(),
        **runs,
    }
    emit(data, args.json, report)


if __name__ == "__main__":
    main()
