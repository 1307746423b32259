#!/usr/bin/env python3
"""The population demo over several seeds: PBT's held-out accuracy against the fixed median.

For every seed, ``gradstore demo --mode population``'s run (``run_population_demo``) on one
freshly started Kubo daemon (or --local): 8 members of the demo's MLP explore learning rate
and weight decay, 8 intervals of 25 mini-batch steps, scored on validation rows; then the
same 8 members, same initial weights and batches, trained the same 200 steps with their
initial hyperparameters fixed. Reported on the held-out rows: the member PBT ranks best at
the end, against the median (and the best) of the fixed members; the row "mean" averages
the seeds. Member keys and the run id are derived from the seed, so a seed's run repeats.
Target: the mean of PBT over the seeds above the mean of the fixed medians.

    .venv/bin/python -m benchmarks population [--seeds 0-7] [--local] [--json] [--kubo PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import dump_json, kubo_binary, machine, start_daemons, table
from benchmarks.bench_demo_compress import seeds_arg
from gradstore.demo import digits_split
from gradstore.demo._population import PopulationDemoConfig, run_population_demo
from gradstore.messages import SigningKey
from gradstore.node import Node, connect, stop_all


def _key(seed: int, who: str) -> SigningKey:
    return SigningKey.from_seed(hashlib.sha256(f"bench population {seed} {who}".encode()).digest())


async def one(node: Node, seed: int) -> dict[str, Any]:
    cfg = PopulationDemoConfig(seed=seed)
    start = time.perf_counter()
    r = await run_population_demo(
        cfg,
        node,
        digits_split(1, seed),
        controller_key=_key(seed, "controller"),
        member_keys=[_key(seed, f"member {i}") for i in range(cfg.members)],
        run=f"benchpopulation{seed:04d}",
    )
    return {
        "seed": seed,
        "pbt": r.pbt_accuracy,
        "fixed_median": r.fixed_median,
        "fixed_best": r.fixed_best,
        "best_hparams": r.best_hparams,
        "head": str(r.head),
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--seeds", type=seeds_arg, default=seeds_arg("0-7"))
    parser.add_argument("--local", action="store_true", help="the embedded node, not Kubo")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo", default=None)
    args = parser.parse_args()
    daemons = [] if args.local else start_daemons(kubo_binary(args.kubo), 1)

    async def go(tmp: str) -> list[dict[str, Any]]:
        node = connect(local=Path(tmp) / "node") if args.local else daemons[0].node()
        try:
            return [await one(node, seed) for seed in args.seeds]
        finally:
            await node.aclose()

    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = asyncio.run(go(tmp))
    finally:
        stop_all(daemons)
    mean = {k: statistics.mean(r[k] for r in runs) for k in ("pbt", "fixed_median", "fixed_best")}
    if args.json:
        dump_json({"machine": machine(), "seeds": args.seeds, "runs": runs, "mean": mean})
        return
    print(
        f"gradstore demo --mode population, 8 members x 200 steps, seeds "
        f"{','.join(map(str, args.seeds))}; {'local node' if args.local else 'Kubo'}"
    )
    rows = [
        [
            r["seed"], f"{r['pbt']:.2%}", f"{r['fixed_median']:.2%}", f"{r['fixed_best']:.2%}",
            f"{100 * (r['pbt'] - r['fixed_median']):+.1f}", f"{r['seconds']:.1f}",
        ]
        for r in runs
    ]  # fmt: skip
    rows.append([
        "mean", f"{mean['pbt']:.2%}", f"{mean['fixed_median']:.2%}", f"{mean['fixed_best']:.2%}",
        f"{100 * (mean['pbt'] - mean['fixed_median']):+.1f}",
        "ok" if mean["pbt"] > mean["fixed_median"] else "MISSED",
    ])  # fmt: skip
    print(table(["seed", "PBT", "fixed median", "fixed best", "pts", "s"], rows))


if __name__ == "__main__":
    main()
