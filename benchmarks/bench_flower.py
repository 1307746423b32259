#!/usr/bin/env python3
"""A Flower round with gradstore against plain Flower: bytes over Flower's transport, wall time.

One run of Flower's own processes on loopback (a SuperLink, --clients SuperNodes, the
example's launcher in examples/flower/run.py) and one Kubo (the one at $GRADSTORE_API if it
answers, else one started here). The ServerApp (benchmarks/bench_flower_app) plays one round
at a time, each side going first in turn, --repeat times each, with the same model
(--mib MiB of float32 in 8 tensors) and the same clients:

  flower      FedAvg: the model goes down and every client's arrays come back through Flower
  gradstore   GradstoreStrategy(FedAvg): the model goes down through Flower, each client puts
              its arrays into IPFS and replies with a signed CID; the strategy fetches and
              verifies them, aggregates, stores the aggregate and a signed record
  gradstore+model   the same with model_via="ipfs": the model goes down by CID as well

"down"/"up" are the serialized sizes of Flower's message objects (instructions / replies);
a round's seconds run from configure_train to the end of aggregate_train.

    .venv/bin/python -m benchmarks flower          options: --mib 16 --repeat 3 --json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks._common import MiB, dump_json, machine, table
from gradstore.messages import SigningKey

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "benchmarks" / "bench_flower_app"
MARK = "gradstore-bench "


def _launcher() -> ModuleType:
    """examples/flower/run.py (Federation, kubo, toml_string), imported by path."""
    spec = importlib.util.spec_from_file_location("flower_run", ROOT / "examples/flower/run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=16.0, help="model size (float32)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per side")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--api", help="Kubo RPC URL (default $GRADSTORE_API, else start one)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    run = _launcher()

    rows: list[dict[str, Any]] = []
    agree: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="gradstore-bench-flower-") as tmp:
        work = Path(tmp)
        with run.kubo(args.api) as (api, description):
            configs = []
            for i in range(args.clients):
                key = work / f"client{i}.pem"
                SigningKey.generate().save(key)
                configs.append(
                    f"partition-id={i} gradstore-key={run.toml_string(str(key))} "
                    f"gradstore-api={run.toml_string(api)}"
                )
            run_config = (
                f"mib={args.mib} repeat={args.repeat} min-nodes={args.clients} "
                f"gradstore-api={run.toml_string(api)}"
            )
            with run.Federation(work, configs) as federation:
                for line in federation.run(
                    APP, run_config, args.timeout, lambda t: t == MARK + "done"
                ):
                    if line.startswith(MARK + "{"):
                        item = json.loads(line[len(MARK) :])
                        if "agree" in item:
                            agree.append(bool(item["agree"]))
                        else:
                            rows.append(item)
            if len(rows) != 3 * args.repeat:
                print(f"error: {len(rows)} of {3 * args.repeat} rounds reported", file=sys.stderr)
                print((work / "logs" / "flwr-run.log").read_text()[-4000:], file=sys.stderr)
                return 1

    summary: dict[str, dict[str, float]] = {}
    for side in ("flower", "gradstore", "gradstore+model"):
        mine = [r for r in rows if r["side"] == side]
        summary[side] = {
            "down_bytes": statistics.median(r["down"] for r in mine),
            "up_bytes": statistics.median(r["up"] for r in mine),
            "round_s_best": min(r["round_s"] for r in mine),
            "round_s_median": statistics.median(r["round_s"] for r in mine),
            "aggregate_s_median": statistics.median(r["aggregate_s"] for r in mine),
        }
    facts = {
        "node": description,
        "mib": args.mib,
        "clients": args.clients,
        "repeat": args.repeat,
        "machine": machine(),
        "sides": summary,
        "aggregates_agree": all(agree),
    }
    if args.json:
        dump_json(facts)
        return 0
    f = summary["flower"]
    print(
        f"{args.clients} clients x {args.mib:g} MiB float32, {args.repeat} rounds per side, "
        f"{description}, load {facts['machine']['loadavg']}"
    )
    print(
        table(
            ["side", "down B", "up B", "round s best", "median", "aggregate s"],
            [
                [
                    side,
                    f"{s['down_bytes']:,.0f}",
                    f"{s['up_bytes']:,.0f}",
                    f"{s['round_s_best']:.2f}",
                    f"{s['round_s_median']:.2f}",
                    f"{s['aggregate_s_median']:.3f}",
                ]
                for side, s in summary.items()
            ],
        )
    )
    flower_bytes = f["down_bytes"] + f["up_bytes"]
    for side in ("gradstore", "gradstore+model"):
        g = summary[side]
        print(
            f"{side}/flower: bytes over Flower {(g['down_bytes'] + g['up_bytes']) / flower_bytes:.5f}x, "
            f"round time {g['round_s_median'] / f['round_s_median']:.2f}x (medians)"
        )
    print(f"aggregates agree: {all(agree)}; model {args.mib * MiB / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
