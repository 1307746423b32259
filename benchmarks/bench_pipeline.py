#!/usr/bin/env python3
"""The model-parallel pipeline: 4 micro-batches in flight against 1, in samples per second.

``gradstore demo --mode model-parallel``'s loop (``run_pipeline_demo``) on one freshly
started Kubo daemon (or --local): the demo's MLP in two stages (fc1, fc2) x 2 replicas,
4 micro-batches per replica and round, with the first stage keeping 4 (GPipe fill) or 1
(one micro-batch at a time) on the way. Reported: samples per second through the
micro-batch phase (every replica's forward and backward passes, activations put, fetched
and announced; the slowest replica's time), and over whole rounds (adding the steps'
aggregation by the coordinator), with the bubble fraction. Target: >= 1.5x for 4 vs 1 in
the micro-batch phase.

    .venv/bin/python -m benchmarks pipeline [--rounds 5] [--local] [--json] [--kubo PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import dump_json, kubo_binary, machine, start_daemons, table
from gradstore.demo import digits_split
from gradstore.demo._pipeline import PipelineDemoConfig, run_pipeline_demo
from gradstore.node import Node, connect, stop_all
from gradstore.pipeline.runner import ReplicaRound


async def one(node: Node, in_flight: int, rounds: int) -> dict[str, Any]:
    cfg = PipelineDemoConfig(replicas=2, rounds=rounds, micro_batches=4, in_flight=in_flight)
    data = digits_split(cfg.replicas, cfg.seed)
    per_round: list[list[ReplicaRound]] = []
    cpu, wall = time.process_time(), time.perf_counter()
    r = await run_pipeline_demo(cfg, node, data, on_replicas=per_round.append)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    rows = r.rows[1:] or r.rows  # the first round warms up
    reps = [x for round_ in (per_round[1:] or per_round) for x in round_]
    samples = sum(x.samples for x in rows)
    phase = sum(x.phase_s for x in rows)
    return {
        "in_flight": in_flight,
        "rounds": len(rows),
        "phase_samples_per_s": samples / phase,
        "round_samples_per_s": samples / sum(x.seconds for x in rows),
        "bubble_fraction": sum(x.bubble_fraction for x in rows) / len(rows),
        # per replica and round: seconds putting + announcing, fetching, other work (the
        # stage math, verifying messages), and messages sent again
        "put_s": sum(x.put_s for x in reps) / len(reps),
        "fetch_s": sum(x.fetch_s for x in reps) / len(reps),
        "math_s": sum(x.busy_s - x.put_s - x.fetch_s for x in reps) / len(reps),
        "resent": sum(x.resent for x in reps) / len(reps),
        # every replica and the coordinator share this process: its CPU seconds per second
        "cpu_per_s": cpu / wall,
        "accuracy": r.rows[-1].accuracy,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local", action="store_true", help="the embedded node, not Kubo")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo", default=None)
    args = parser.parse_args()
    daemons = [] if args.local else start_daemons(kubo_binary(args.kubo), 1)

    async def go(tmp: str) -> list[dict[str, Any]]:
        node = connect(local=Path(tmp) / "node") if args.local else daemons[0].node()
        try:
            return [await one(node, k, args.rounds) for k in (1, 4)]
        finally:
            await node.aclose()

    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = asyncio.run(go(tmp))
    finally:
        stop_all(daemons)
    speedup = runs[1]["phase_samples_per_s"] / runs[0]["phase_samples_per_s"]
    if args.json:
        dump_json({"machine": machine(), "runs": runs, "speedup": speedup})
        return
    print(
        f"model-parallel MLP, 2 stages x 2 replicas, 4 micro-batches, {args.rounds} rounds; "
        f"{'local node' if args.local else 'Kubo'}"
    )
    rows = [
        [
            r["in_flight"], f"{r['phase_samples_per_s']:.0f}", f"{r['round_samples_per_s']:.0f}",
            f"{r['bubble_fraction']:.0%}", f"{r['put_s'] * 1000:.0f}",
            f"{r['fetch_s'] * 1000:.0f}", f"{r['math_s'] * 1000:.0f}", f"{r['resent']:.1f}", f"{r['cpu_per_s']:.2f}",
            f"{r['accuracy']:.2%}",
        ]
        for r in runs
    ]  # fmt: skip
    print(table(["in flight", "samples/s (micro-batches)", "samples/s (rounds)", "bubble",
                 "put ms", "fetch ms", "other ms", "re-sent", "cpu/s", "accuracy"], rows))  # fmt: skip
    print("(put/fetch/other: per replica and round; re-sent: messages sent again, per replica "
          "and round; cpu/s: this process's CPU seconds per second, every replica and the "
          "coordinator)")  # fmt: skip
    print(f"4 vs 1 in flight: {speedup:.2f}x ({'ok' if speedup >= 1.5 else 'MISSED'} >= 1.5x)")


if __name__ == "__main__":
    main()
