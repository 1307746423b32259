#!/usr/bin/env python3
"""How long does one whole aggregation round take on real Kubo daemons?

Three freshly started isolated Kubo daemons, swarm-connected on loopback: the
coordinator's on the first, the peers split over the other two (so the
coordinator fetches every gradient over bitswap). One round of --peers peers,
each with a float32 gradient of --mib MiB (seeded), aggregated with --method.

Stages (wall seconds unless marked "sum"):
  put                   GradientStore.put inside Peer.publish (mean and slowest peer)
  announce until acked  from the start until every peer's announcement is acknowledged
  resolve+verify (sum)  coordinator: fetch, verify and decode of every input, summed over
                        inputs (fetches run 4 at a time)
  round open            coordinator: from the round opening to its closing
  aggregate             coordinator: aggregation
  publish               coordinator: store the aggregate + round record, publish the result
  result at peer        from the start until a listening peer has the signed result
  fetch aggregate       that peer fetching and verifying the aggregate
  total                 from the start until the peer holds the verified aggregate

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python scripts/bench_round.py
    options: --peers 8 --mib 64 --method fedavg --json --kubo PATH
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import MiB, dump_json, kubo_binary, machine, start_daemons, table
from gradstore.coordinator import Coordinator
from gradstore.format import Gradient, Limits
from gradstore.job import JobConfig, parse_job
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, KuboNode
from gradstore.node.daemon import stop_all
from gradstore.peer import Peer

SEED = 20250918


def make_job(n: int, method: str, mib: int) -> tuple[JobConfig, SigningKey, list[SigningKey]]:
    coord = SigningKey.from_seed(bytes([200]) * 32)
    peers = sorted(
        (SigningKey.from_seed(bytes([i + 1]) * 32) for i in range(n)), key=lambda k: k.did
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


def make_gradients(n: int, mib: int) -> list[Gradient]:
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(n):
        a = np.empty(mib * MiB // 4, dtype=np.float32)
        rng.standard_normal(dtype=np.float32, out=a)
        out.append(Gradient({"grad": a}))
    return out


async def one_round(
    daemons: list[KuboDaemon], args: argparse.Namespace, state: Path
) -> dict[str, Any]:
    config, coord_key, peer_keys = make_job(args.peers, args.method, args.mib)
    grads = make_gradients(args.peers, args.mib)
    limits = Limits(max_bytes=args.mib * MiB + MiB)
    coord_node = daemons[0].node()
    carriers = [d.node() for d in daemons[1:]]
    nodes: list[KuboNode] = [carriers[i % len(carriers)] for i in range(args.peers)]
    timings: dict[str, Any] = {}
    try:
        coordinator = Coordinator(
            config, coord_key, coord_node, state, rebroadcast_s=0.5, linger_s=0
        )
        task = asyncio.create_task(coordinator.run())
        for carrier in carriers:  # pubsub reaches only peers the publisher knows are subscribed
            await carrier.wait_for_topic_peers(config.gradients_topic, 1, timeout=30)
        puts: list[float] = [0.0] * args.peers
        acked: list[float] = [0.0] * args.peers

        async with Peer(config, nodes[0]) as listener:
            listener.store.limits = limits
            start = time.perf_counter()

            async def publish(i: int) -> None:
                async with Peer(config, nodes[i], peer_keys[i], first_backoff_s=0.5) as peer:
                    peer.store.limits = limits
                    inner = peer.store.put

                    async def timed_put(g: Gradient, **kw: Any) -> Any:
                        t = time.perf_counter()
                        cid = await inner(g, **kw)
                        puts[i] = time.perf_counter() - t
                        return cid

                    peer.store.put = timed_put  # type: ignore[method-assign,assignment]
                    await peer.publish(grads[i], 0, 100 + i, timeout=600)
                    acked[i] = time.perf_counter() - start

            await asyncio.gather(*(publish(i) for i in range(args.peers)))
            await listener._wait_for(lambda: 0 in listener._results, None, time.monotonic() + 600)
            t_result = time.perf_counter() - start
            t = time.perf_counter()
            result = await listener.await_result(0, timeout=600)
            t_fetch = time.perf_counter() - t
            total = time.perf_counter() - start
        outcomes = await asyncio.wait_for(task, 60)
        outcome = outcomes[-1]
        if outcome.status != "closed" or len(result.peers) != args.peers:
            raise SystemExit(f"round did not close with every peer: {outcome}")
        stats = dict(outcome.stats)
        timings = {
            "put_mean_s": sum(puts) / len(puts),
            "put_max_s": max(puts),
            "acked_s": max(acked),
            "resolve_sum_s": stats.get("resolve_s"),
            "open_s": stats.get("open_s"),
            "aggregate_s": stats.get("aggregate_s"),
            "publish_s": stats.get("publish_s"),
            "result_s": t_result,
            "fetch_aggregate_s": t_fetch,
            "total_s": total,
            "coordinator_stats": stats,
            "aggregate_cid": str(result.cid),
        }
    finally:
        await coord_node.aclose()
        for carrier in carriers:
            await carrier.aclose()
    return timings


def report(data: dict[str, Any]) -> str:
    t = data["timings"]
    payload = data["peers"] * data["mib"]
    rows = [
        ["put (mean / slowest peer)", f"{t['put_mean_s']:.3f} / {t['put_max_s']:.3f}"],
        ["announce until acked", f"{t['acked_s']:.3f}"],
        ["resolve+verify (sum)", f"{t['resolve_sum_s']:.3f}"],
        ["round open", f"{t['open_s']:.3f}"],
        ["aggregate", f"{t['aggregate_s']:.3f}"],
        ["publish", f"{t['publish_s']:.3f}"],
        ["result at peer", f"{t['result_s']:.3f}"],
        ["fetch aggregate", f"{t['fetch_aggregate_s']:.3f}"],
        ["total", f"{t['total_s']:.3f}"],
    ]
    head = (
        f"{data['peers']} peers x {data['mib']} MiB float32 ({payload} MiB), method "
        f"{data['method']}, 3 Kubo {data['kubo']} daemons (coordinator on its own), "
        f"load {data['machine']['loadavg']}"
    )
    return head + "\n\n" + table(["stage", "seconds"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--mib", type=int, default=64, help="gradient size per peer in MiB")
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--kubo", help="Kubo binary (default: $GRADSTORE_KUBO, PATH, cache)")
    args = parser.parse_args()
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
        "mib": args.mib,
        "method": args.method,
        "kubo": version,
        "machine": machine(),
        "timings": timings,
    }
    if args.json:
        dump_json(data)
    else:
        print(report(data))


if __name__ == "__main__":
    main()
