#!/usr/bin/env python3
"""How long does one whole aggregation round take on real Kubo daemons?

Three freshly started isolated Kubo daemons, swarm-connected on loopback: the
coordinator's on the first, the peers split over the other two (so the
coordinator fetches every gradient over bitswap). One round of --peers peers,
each with a float32 gradient of --mib MiB (seeded), aggregated with --method.

Stages (wall seconds unless marked "sum"):
  put                   each peer storing its gradient on its node (mean and slowest peer)
  announce until acked  from the start until every peer's input is verified
  announcements / peer  announcements sent per peer (re-announcements count)
  first ann. to close   coordinator: from the first accepted announcement to the close
  resolve+verify (sum)  coordinator: fetch, verify and decode of every input, summed over
                        inputs (fetches run several at a time)
  round open            coordinator: from the round opening to its closing
  aggregate             coordinator: aggregation
  publish               coordinator: store the aggregate + round record, publish the result
  result at peer        from the start until a listening peer has the signed result
  fetch aggregate       that peer fetching and verifying the aggregate
  total                 from the announcements until a peer holds the verified aggregate

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m benchmarks round
    options: --peers 8 --mib 64 (or --kib 64) --method fedavg --json --kubo PATH
    e.g. --peers 256 --kib 64, --peers 1000 --kib 16
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import MiB, emit, kubo_binary, machine, start_daemons, table
from gradstore.coordinator import Journal
from gradstore.format import Gradient, Limits
from gradstore.job import JobConfig, parse_job
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, KuboNode, stop_all
from gradstore.peer import Peer

SEED = 20250918


def make_job(n: int, method: str) -> tuple[JobConfig, SigningKey, list[SigningKey]]:
    coord = SigningKey.from_seed(b"\xc8" * 32)
    peers = sorted(
        (SigningKey.from_seed((i + 1).to_bytes(32, "big")) for i in range(n)),
        key=lambda k: k.did,
    )
    raw = {
        "job": "bench-round",
        "coordinator": coord.did,
        "peers": [k.did for k in peers],
        "aggregation": {"method": method},
        "rounds": {"count": 1, "quorum": n, "deadline_s": 600.0},
    }
    config = parse_job(raw)
    return config, coord, peers


def make_gradients(n: int, nbytes: int) -> list[Gradient]:
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(n):
        a = np.empty(nbytes // 4, dtype=np.float32)
        rng.standard_normal(dtype=np.float32, out=a)
        out.append(Gradient({"grad": a}))
    return out


async def one_round(
    daemons: list[KuboDaemon], args: argparse.Namespace, state: Path
) -> dict[str, Any]:
    config, coord_key, peer_keys = make_job(args.peers, args.method)
    grads = make_gradients(args.peers, args.bytes)
    limits = Limits(max_bytes=args.bytes + MiB)
    carriers = [d.node() for d in daemons[1:]]
    clients = [daemons[1 + j % 2].node() for j in range((args.peers + 15) // 16)]
    nodes: list[KuboNode] = [clients[i // 16] for i in range(args.peers)]
    timings: dict[str, Any] = {}
    job_file, key_file = state / "job.toml", state / "coord.key"
    write_job(config, job_file, args.bytes + MiB)
    coord_key.save(key_file)
    log = open(state / "coordinator.log", "wb")  # noqa: SIM115 (closed in finally)
    process = subprocess.Popen(
        [sys.executable, "-m", "gradstore", "coordinator", "--config", str(job_file),
         "--key", str(key_file), "--api", daemons[0].api_url, "--state", str(state / "state")],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        for carrier in carriers:  # pubsub reaches only peers the publisher knows are subscribed
            await carrier.wait_for_topic_peers(config.gradients_topic, 1, timeout=60)
        puts: list[float] = [0.0] * args.peers
        acked: list[float] = [0.0] * args.peers
        sent: list[int] = [0] * args.peers

        async with Peer(config, nodes[0]) as listener:
            listener.store.limits = limits
            start = time.perf_counter()

            everyone_stored = asyncio.Event()
            stored = 0
            putting = asyncio.Semaphore(32)  # staging only: the nodes' connection pools are finite

            async def publish(i: int) -> None:
                nonlocal stored, start
                async with Peer(config, nodes[i], peer_keys[i], listener=listener) as peer:
                    peer.store.limits = limits
                    async with putting:
                        t = time.perf_counter()
                        cid = await peer.store.put(peer.prepare(grads[i], 0, 100 + i))
                        puts[i] = time.perf_counter() - t
                    stored += 1
                    if stored == args.peers:
                        start = time.perf_counter()
                        everyone_stored.set()
                    await everyone_stored.wait()
                    await peer.announce(cid, 0, 100 + i, timeout=600)
                    acked[i] = time.perf_counter() - start
                    sent[i] = peer.announcements_sent

            await asyncio.gather(*(publish(i) for i in range(args.peers)))
            result = await listener.await_result(0, timeout=600)
            total = time.perf_counter() - start
        code = await asyncio.to_thread(process.wait, 120)
        with Journal(state / "state" / "journal.sqlite") as journal:
            stats = journal.stats(0) or {}
        if code != 0 or len(result.peers) != args.peers:
            raise SystemExit(f"round did not close with every peer: exit {code}, {stats}")
        timings = {
            "put_mean_s": sum(puts) / len(puts),
            "put_max_s": max(puts),
            "acked_s": max(acked),
            "resolve_sum_s": stats.get("resolve_s"),
            "open_s": stats.get("open_s"),
            "aggregate_s": stats.get("aggregate_s"),
            "publish_s": stats.get("publish_s"),
            "announcements_per_peer": sum(sent) / len(sent),
            "announcements_max": max(sent),
            "started_s": stats.get("started_s"),
            "total_s": total,
            "coordinator_stats": stats,
            "aggregate_cid": str(result.cid),
        }
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
        for carrier in (*carriers, *clients):
            await carrier.aclose()
    return timings


def write_job(config: JobConfig, path: Path, max_bytes: int) -> None:
    peers = ", ".join(f'"{p}"' for p in config.peers)
    r = config.rounds
    path.write_text(
        f'job = "{config.job}"\ncoordinator = "{config.coordinator}"\npeers = [{peers}]\n'
        f'[aggregation]\nmethod = "{config.method}"\n'
        f"[rounds]\ncount = {r.count}\nquorum = {r.quorum}\ndeadline_s = {r.deadline_s}\n"
        f"[limits]\nmax_gradient_bytes = {max_bytes}\n"
    )


def report(data: dict[str, Any]) -> str:
    t = data["timings"]
    size = data["bytes"]
    each = f"{size // MiB} MiB" if size >= MiB else f"{size // 1024} KiB"
    rows = [
        ["put (mean / slowest peer)", f"{t['put_mean_s']:.3f} / {t['put_max_s']:.3f}"],
        ["announce until verified", f"{t['acked_s']:.3f}"],
        [
            "announcements / peer (max)",
            f"{t['announcements_per_peer']:.2f} ({t['announcements_max']})",
        ],
        ["resolve+verify (sum)", f"{t['resolve_sum_s']:.3f}"],
        ["first announcement to close", f"{t['started_s']:.3f}"],
        ["aggregate", f"{t['aggregate_s']:.3f}"],
        ["publish", f"{t['publish_s']:.3f}"],
        ["total (peer holds the aggregate)", f"{t['total_s']:.3f}"],
    ]
    head = (
        f"{data['peers']} peers x {each} float32 ({data['peers'] * size / MiB:.0f} MiB), method "
        f"{data['method']}, 3 Kubo {data['kubo']} daemons (coordinator on its own), "
        f"load {data['machine']['loadavg']}"
    )
    return head + "\n\n" + table(["stage", "seconds"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--peers", type=int, default=8)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--mib", type=int, help="gradient size per peer in MiB (default 64)")
    size.add_argument("--kib", type=int, help="gradient size per peer in KiB")
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--kubo", help="Kubo binary (default: $GRADSTORE_KUBO, PATH, cache)")
    args = parser.parse_args()
    args.bytes = args.kib * 1024 if args.kib else (args.mib or 64) * MiB
    binary = kubo_binary(args.kubo)
    daemons = start_daemons(binary, 3, connect=True)
    try:
        version = daemons[0].run("version", "--number").stdout.decode().strip()
        with tempfile.TemporaryDirectory(prefix="gradstore-bench-round-") as tmp:
            timings = asyncio.run(one_round(daemons, args, Path(tmp)))
    finally:
        stop_all(daemons)
    data = {
        "peers": args.peers,
        "bytes": args.bytes,
        "method": args.method,
        "kubo": version,
        "machine": machine(),
        "timings": timings,
    }
    emit(data, args.json, report)


if __name__ == "__main__":
    main()
