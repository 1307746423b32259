#!/usr/bin/env python3
"""The model-parallel pipeline: 4 micro-batches in flight against 1, in samples per second.

The demo's model and data (``gradstore demo --mode model-parallel``: digits, an MLP cut into
two stages, fc1 with tanh, then fc2 and the loss), with a hidden width of --hidden (default
1024: a stage's forward and backward passes then take about as long as putting and fetching
its activations; the demo's own 64 makes them negligible). Every stage replica runs in its
own process, as it would on its own machine, with --threads BLAS thread(s), over its own
freshly started Kubo daemon (--daemons own; the coordinator, a thread of this process, has
one too; they are swarm-connected, so a stage fetches its neighbour's activations by
bitswap), or all over one (--daemons shared). --lanes lanes
(replicas per stage), 4 micro-batches per lane and round, the first stage keeping 4 (GPipe
fill and drain) or 1 on the way; the two settings take turns (--repeat pairs), each a fresh
job of --rounds rounds of which the first warms up and is left out.

Reported per setting: samples per second through the micro-batch phase (every replica's
forward and backward passes, activations put, fetched and announced: the slowest replica's
seconds in a round) and over whole rounds (adding the steps' aggregation); the bubble (the
replicas' time waiting on a neighbour); per replica and round, seconds putting and
announcing documents, fetching them, and the rest of its work (the stage math, verifying
messages); the messages sent again; the replica processes' CPU seconds per second of the
phase; and the training loss after the last round (the same in both settings: pipelining
changes the order of the work, not its result). Target: >= 1.5x for 4 vs 1 in flight.

    .venv/bin/python -m benchmarks pipeline [--rounds 6] [--hidden 1024] [--lanes 1]
        [--daemons own|shared] [--repeat 1] [--threads 1] [--json] [--kubo PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import dump_json, kubo_binary, machine, start_daemons, table
from gradstore.coordinator import Coordinator
from gradstore.demo import digits_split
from gradstore.demo._models import MLP
from gradstore.demo._pipeline import PipelineDemoConfig, pipeline_job
from gradstore.job import JobConfig
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, connect, stop_all
from gradstore.peer import Peer
from gradstore.pipeline.layers import mlp_stages
from gradstore.pipeline.runner import StageReplica, micro_batches

MICRO_BATCHES = 4
SEED = 0
LR = 0.2  # 0.5, the demo's, diverges for a while at this width


def replica_main(spec: dict[str, Any], results: Any) -> None:
    """One stage replica's every round, in its own process; a tuple per round on
    ``results`` (see ``summarize``), or ("error", text)."""
    try:
        asyncio.run(_replica(spec, results))
    except BaseException as exc:
        results.put(("error", f"stage {spec['stage']} lane {spec['lane']}: {exc!r}"))
        raise


async def _replica(spec: dict[str, Any], results: Any) -> None:
    config: JobConfig = spec["config"]
    key = SigningKey.from_seed(spec["seed"])
    data = digits_split(spec["lanes"], SEED)
    shard = data.shards[spec["lane"]]
    model = MLP(data.n_features, data.n_classes, spec["hidden"])
    layer = mlp_stages()[spec["stage"]]
    params = {
        n: a
        for n, a in model.init(np.random.default_rng(SEED)).items()
        if n.startswith(layer.layer)
    }
    x = micro_batches(shard.x, MICRO_BATCHES) if spec["stage"] == 0 else None
    y = micro_batches(shard.y, MICRO_BATCHES) if spec["stage"] == 1 else None
    async with (
        connect(spec["api"]) as node,
        Peer(config, node, key, first_backoff_s=0.5) as peer,
        StageReplica(config, key, node, peer, layer) as replica,
    ):
        for r in range(spec["rounds"]):
            cpu, start = time.process_time(), time.perf_counter()
            params, info = await replica.train_round(r, params, x=x, y=y, rows=len(shard), lr=LR)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            results.put(
                (spec["in_flight"], r, spec["stage"], spec["lane"], len(shard), seconds,
                 info.wall_s, info.bubble_s, info.busy_s, info.put_s, info.fetch_s,
                 info.resent, cpu, info.loss)
            )  # fmt: skip


@contextmanager
def coordinator(daemon: KuboDaemon, config: JobConfig, key: SigningKey) -> Iterator[None]:
    """The job's Coordinator on an event loop in a thread, until its rounds are done."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failed: list[BaseException] = []

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as state:
            async with daemon.node() as node:
                await Coordinator(config, key, node, Path(state), linger_s=0.0).run(stop)

    def target() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=target, name="coordinator", daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(120)
    if failed:
        raise failed[0]


def one(
    daemons: list[KuboDaemon], args: argparse.Namespace, in_flight: int
) -> list[tuple[Any, ...]]:
    """A fresh job with ``in_flight`` micro-batches on the way: every replica's rounds. The
    coordinator uses ``daemons[0]``; replica ``i`` (body lanes, then head lanes) uses
    ``daemons[1 + i]``, or the one daemon there is."""
    cfg = PipelineDemoConfig(
        replicas=args.lanes, rounds=args.rounds, micro_batches=MICRO_BATCHES,
        in_flight=in_flight, seed=SEED, lr=LR, hidden=args.hidden,
    )  # fmt: skip
    data = digits_split(args.lanes, SEED)
    schema = MLP(data.n_features, data.n_classes, args.hidden).init(np.random.default_rng(SEED))
    ckey = SigningKey.generate()
    seeds = [[os.urandom(32) for _ in range(args.lanes)] for _ in range(2)]
    keys = [[SigningKey.from_seed(s) for s in stage] for stage in seeds]
    job = f"bench-pipeline-{in_flight}-{os.urandom(3).hex()}"
    config = pipeline_job(job, ckey, keys[0], keys[1], cfg, schema)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    rows: list[tuple[Any, ...]] = []
    with coordinator(daemons[0], config, ckey):
        specs = [
            {"config": config, "seed": seeds[stage][lane],
             "api": daemons[(1 + stage * args.lanes + lane) % len(daemons)].api_url,
             "stage": stage, "lane": lane, "lanes": args.lanes, "hidden": args.hidden,
             "rounds": args.rounds, "in_flight": in_flight}
            for stage in range(2)
            for lane in range(args.lanes)
        ]  # fmt: skip
        procs = [ctx.Process(target=replica_main, args=(spec, results)) for spec in specs]
        for p in procs:
            p.start()
        while len(rows) < len(procs) * args.rounds:
            row = results.get(timeout=600)
            if row[0] == "error":
                raise SystemExit(f"a replica failed: {row[1]}")
            rows.append(row)
        for p in procs:
            p.join(60)
    return rows


#: The fields of a result row, in order.
FIELDS = ("in_flight", "round", "stage", "lane", "rows", "seconds", "wall_s", "bubble_s",
          "busy_s", "put_s", "fetch_s", "resent", "cpu_s", "loss")  # fmt: skip


def summarize(run: list[tuple[Any, ...]]) -> dict[str, Any]:
    """One run's counted rounds (not the first): per round its slowest replica's phase and
    round seconds; per replica and round the breakdown of its time."""
    reps = [dict(zip(FIELDS, r, strict=True)) for r in run]
    counted = [r for r in reps if r["round"] > 0]
    rounds = sorted({r["round"] for r in counted})
    samples = phase = whole = cpu = 0.0
    for n in rounds:
        mine = [r for r in counted if r["round"] == n]
        samples += sum(r["rows"] for r in mine if r["stage"] == 0)
        phase += max(r["wall_s"] for r in mine)
        whole += max(r["seconds"] for r in mine)
        cpu += sum(r["cpu_s"] for r in mine)
    last = max(r["round"] for r in reps)
    heads = [r for r in reps if r["round"] == last and r["stage"] == 1]
    return {
        "in_flight": reps[0]["in_flight"],
        "rounds": len(rounds),
        "phase_samples_per_s": samples / phase,
        "round_samples_per_s": samples / whole,
        "bubble_fraction": sum(r["bubble_s"] for r in counted) / sum(r["wall_s"] for r in counted),
        "put_s": statistics.fmean(r["put_s"] for r in counted),
        "fetch_s": statistics.fmean(r["fetch_s"] for r in counted),
        "math_s": statistics.fmean(r["busy_s"] - r["put_s"] - r["fetch_s"] for r in counted),
        "resent": statistics.fmean(r["resent"] for r in counted),
        # the replica processes' CPU seconds per second of whole rounds
        "cpu_per_s": cpu / whole,
        # each head replica's loss is its lane's mean: the whole batch's is their mean by rows
        "loss": sum(r["loss"] * r["rows"] for r in heads) / sum(r["rows"] for r in heads),
    }


def report(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    pairs = [
        runs[i + 1]["phase_samples_per_s"] / runs[i]["phase_samples_per_s"]
        for i in range(0, len(runs), 2)
    ]
    total = {
        k: sum(r["phase_samples_per_s"] for r in runs if r["in_flight"] == k)
        for k in (1, MICRO_BATCHES)
    }
    speedup = total[MICRO_BATCHES] / total[1]
    if args.json:
        dump_json({"machine": machine(), "args": vars(args), "runs": runs, "pairs": pairs,
                   "speedup": speedup})  # fmt: skip
        return
    print(
        f"model-parallel MLP 64-{args.hidden}-10, 2 stages x {args.lanes} lane(s), each replica "
        f"its own process ({args.threads} BLAS thread(s)), {MICRO_BATCHES} micro-batches, "
        f"{args.rounds} rounds per run (the first not counted), "
        f"{'a Kubo daemon each' if args.daemons == 'own' else 'one Kubo daemon'}; load "
        f"{machine()['loadavg']}"
    )
    rows = [
        [
            r["in_flight"], f"{r['phase_samples_per_s']:.0f}", f"{r['round_samples_per_s']:.0f}",
            f"{r['bubble_fraction']:.0%}", f"{r['put_s'] * 1000:.0f}",
            f"{r['fetch_s'] * 1000:.0f}", f"{r['math_s'] * 1000:.0f}", f"{r['resent']:.1f}",
            f"{r['cpu_per_s']:.2f}", f"{r['loss']:.6f}",
        ]
        for r in runs
    ]  # fmt: skip
    print(table(["in flight", "samples/s (micro-batches)", "samples/s (rounds)", "bubble",
                 "put ms", "fetch ms", "other ms", "re-sent", "cpu/s", "loss"], rows))  # fmt: skip
    print("(put/fetch/other: per replica and round; re-sent: messages sent again, per replica "
          "and round; cpu/s: the replica processes' CPU seconds per second of whole rounds; "
          "loss: the training loss after the last round)")  # fmt: skip
    each = ", ".join(f"{p:.2f}x" for p in pairs)
    print(
        f"4 vs 1 in flight: {speedup:.2f}x{f' (pairs: {each})' if len(pairs) > 1 else ''} "
        f"({'ok' if speedup >= 1.5 else 'MISSED'} >= 1.5x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rounds", type=int, default=6, help="per run, the first warms up")
    parser.add_argument("--hidden", type=int, default=1024, help="the MLP's hidden width")
    parser.add_argument("--lanes", type=int, default=1, help="replicas per stage")
    parser.add_argument("--repeat", type=int, default=1, help="pairs of runs (1 then 4)")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per replica")
    parser.add_argument(
        "--daemons",
        choices=("own", "shared"),
        default="own",
        help="own: a Kubo daemon per replica and one for the coordinator, swarm-connected "
        "(as on separate machines; activations move by bitswap); shared: one for all",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo", default=None)
    args = parser.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # the replica processes inherit it
    own = args.daemons == "own"
    daemons = start_daemons(kubo_binary(args.kubo), 1 + 2 * args.lanes if own else 1, connect=own)
    runs: list[dict[str, Any]] = []
    try:
        for _ in range(args.repeat):
            for k in (1, MICRO_BATCHES):
                runs.append(summarize(one(daemons, args, k)))
    finally:
        stop_all(daemons)
    report(args, runs)


if __name__ == "__main__":
    main()
