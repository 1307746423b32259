#!/usr/bin/env python3
"""How much memory does the coordinator need for a round of large inputs?

Three isolated Kubo daemons on loopback: the coordinator's, and two carrying the peers.
Each of --peers peers stores a float32 gradient of --mib MiB (seeded, generated and stored
one at a time, so this process never holds them all), then all announce. The coordinator
runs in its own process; its peak RSS (VmHWM) is read from /proc while it runs.

Two coordinators, one after the other, in the same run:
  streamed   the defaults: inputs are verified within a 256 MiB budget, kept in memory
             only up to 128 MiB, and read back from the node range by range at the close
  in memory  every verified input kept in memory until the close (how gradstore worked
             before): the reference, O(peers x model)

    .venv/bin/python -m benchmarks memory [--peers 8] [--mib 256] [--method fedavg]
        [--no-reference] [--json] [--kubo PATH]
    e.g. --peers 16 --mib 1024 --no-reference --one-node   (16 GiB of inputs; with
    --one-node the peers store on the coordinator's daemon, so the disk holds one copy)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import (
    MiB,
    dump_json,
    kubo_binary,
    machine,
    one_round_job,
    peak_rss_of,
    start_daemons,
    table,
)
from gradstore.coordinator import Coordinator
from gradstore.format import Gradient
from gradstore.job import JobConfig, load_job
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, KuboNode, stop_all
from gradstore.peer import Peer

SEED = 20261201


def make_job(n: int, method: str, max_bytes: int, path: Path) -> tuple[JobConfig, list[SigningKey]]:
    return one_round_job(n, method, max_bytes, path, name="bench-memory", seed=0xC9)


def serve(args: argparse.Namespace) -> None:
    """The coordinator process (``--serve``): one round, then print its stats as JSON."""
    config = load_job(args.serve)
    key = SigningKey.load(Path(args.serve).with_suffix(".key"))
    options: dict[str, Any] = {"linger_s": 0}
    if args.in_memory:
        options.update(memory_budget_bytes=1 << 50, keep_bytes=1 << 50)

    async def run() -> dict[str, Any]:
        node = KuboNode(args.api)
        try:
            coordinator = Coordinator(config, key, node, args.state, **options)
            (outcome,) = await coordinator.run()
            return {"status": outcome.status, "output": str(outcome.output), **outcome.stats}
        finally:
            await node.aclose()

    print(json.dumps(asyncio.run(run())), flush=True)


async def one_round(
    daemons: list[KuboDaemon], args: argparse.Namespace, tmp: Path, in_memory: bool
) -> dict[str, Any]:
    name = "in-memory" if in_memory else "streamed"
    job = tmp / f"{name}.toml"
    config, peers = make_job(args.peers, args.method, args.mib * MiB + MiB, job)
    carriers = [d.node() for d in daemons[1:]] or [daemons[0].node()]
    cmd = [
        sys.executable, "-m", "benchmarks.bench_memory", "--serve", str(job), "--api", daemons[0].api_url,
        "--state", str(tmp / f"{name}-state"),
    ]  # fmt: skip
    if in_memory:
        cmd.append("--in-memory")
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak = 0
    try:
        deadline = time.monotonic() + 60
        async with daemons[0].node() as coordinator_node:
            while config.gradients_topic not in await coordinator_node.pubsub_topics():
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("the coordinator did not start")
                await asyncio.sleep(0.1)
        for carrier in carriers if len(daemons) > 1 else ():
            await carrier.wait_for_topic_peers(config.gradients_topic, 1, timeout=60)
        t0 = time.perf_counter()
        cids = []
        rng = np.random.default_rng(SEED)
        for i, key in enumerate(peers):  # one gradient in this process at a time
            values = np.empty(args.mib * MiB // 4, np.float32)
            rng.standard_normal(dtype=np.float32, out=values)
            node = carriers[i % len(carriers)]
            async with Peer(config, node, key) as peer:
                cids.append(await peer.store.put(peer.prepare(Gradient({"w": values}), 0, 1 + i)))
            del values
            peak = max(peak, peak_rss_of(process.pid))
        t_put = time.perf_counter() - t0

        async def announce(i: int) -> None:
            async with Peer(config, carriers[i % len(carriers)], peers[i]) as peer:
                await peer.announce(cids[i], 0, 1 + i, wait=False)

        t0 = time.perf_counter()
        await asyncio.gather(*(announce(i) for i in range(args.peers)))
        while process.poll() is None:
            peak = max(peak, peak_rss_of(process.pid))
            await asyncio.sleep(0.05)
        t_round = time.perf_counter() - t0
        out, _ = process.communicate()
        stats = json.loads(out.strip().splitlines()[-1])
        if stats["status"] != "closed":
            raise SystemExit(f"{name}: the round did not close: {stats}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for carrier in carriers:
            await carrier.aclose()
    return {"peak_rss": peak, "put_s": t_put, "round_s": t_round, "stats": stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--no-reference", action="store_true", help="skip the in-memory run")
    parser.add_argument(
        "--one-node", action="store_true", help="peers store on the coordinator's own daemon"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--api", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--in-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    binary = kubo_binary(args.kubo)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gradstore-bench-memory-") as tmp:
        for in_memory in (False, True) if not args.no_reference else (False,):
            daemons = start_daemons(binary, 1 if args.one_node else 3, connect=True)
            try:
                runs["in memory" if in_memory else "streamed"] = asyncio.run(
                    one_round(daemons, args, Path(tmp), in_memory)
                )
            finally:
                stop_all(daemons)
    target = 3 * args.mib * MiB + 300 * MiB
    data = {
        "peers": args.peers,
        "mib": args.mib,
        "method": args.method,
        "target_peak_rss": target,
        "machine": machine(),
        "runs": runs,
    }
    if args.json:
        dump_json(data)
        return
    rows = []
    for name, r in runs.items():
        rows.append(
            [
                name,
                f"{r['peak_rss'] / MiB:,.0f}",
                f"{r['peak_rss'] / target:.2f}",
                f"{r['round_s']:.1f}",
                f"{r['stats'].get('aggregate_s', 0):.1f}",
                f"{args.peers * args.mib / r['round_s']:,.0f}",
            ]
        )
    print(
        f"{args.peers} peers x {args.mib} MiB float32, {args.method}; target peak RSS "
        f"3 x {args.mib} MiB + 300 MiB = {target / MiB:,.0f} MiB; load {data['machine']['loadavg']}\n"
    )
    print(
        table(
            ["coordinator", "peak RSS MiB", "vs target", "round s", "aggregate s", "MiB/s"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
