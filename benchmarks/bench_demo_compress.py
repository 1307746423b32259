#!/usr/bin/env python3
"""The demo with and without compression, same settings, side by side: input bytes, accuracy.

Each configuration runs `gradstore demo` on one freshly started Kubo daemon (or --local)
for every seed: once uncompressed and once with its compression spec, everything else
equal (seed, peers, rounds, model). Each run's --summary-json gives ``input_bytes`` (the
bytes of all documents the peers stored over the run) and ``accuracy`` (held-out, after
the last round). A seed changes the data split, the initialisation and local SGD, and the
accuracy of one seed is noisy (the held-out set is 359 images, 0.28 points each, and the
uncompressed runs alone span about 3 points across seeds), so each row reports the mean
and the worst difference over the seeds. Targets: at least 50x fewer input_bytes, and the
mean accuracy over the seeds within 2 points of the uncompressed runs' mean.

    .venv/bin/python -m benchmarks demo_compress [--seeds 0-7] [--rounds 20]
        [--peers 4] [--local] [--json] [--kubo PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import dump_json, kubo_binary, machine, start_daemons, table
from gradstore.cli import main as gradstore
from gradstore.node import stop_all

#: The spec the demo's docs recommend: 2-bit values leave room for more of each chunk.
RECOMMENDED = "topk:0.027,values=2bit"
#: The example spec of the compression work: int8 values, 1.5% of each chunk.
EXAMPLE = "topk:0.015,values=int8"

#: (mode, model, extra demo options that override the defaults, spec): the default demo
#: (federated, MLP of 64 hidden units) with both specs, the softmax model, and data-parallel
#: training (one SGD step per round) over 20 and 60 rounds.
CONFIGS: list[tuple[str, str, tuple[str, ...], str]] = [
    ("federated", "mlp", (), RECOMMENDED),
    ("federated", "mlp", (), EXAMPLE),
    ("federated", "softmax", (), RECOMMENDED),
    ("data-parallel", "mlp", (), RECOMMENDED),
    ("data-parallel", "mlp", ("--rounds", "60"), RECOMMENDED),
]


def seeds_arg(text: str) -> list[int]:
    """``0-7`` or ``0,3,5``."""
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-", 1))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def run(
    node_args: list[str],
    args: argparse.Namespace,
    setting: tuple[str, str, tuple[str, ...]],
    seed: int,
    spec: str | None,
) -> Any:
    mode, model, extra = setting
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        argv = [
            "demo", *node_args, "--quiet", "--mode", mode, "--model", model,
            "--peers", str(args.peers), "--rounds", str(args.rounds), "--seed", str(seed),
            "--summary-json", str(summary), *extra,
        ]  # fmt: skip
        if spec is not None:
            argv += ["--compress", spec]
        with contextlib.redirect_stdout(io.StringIO()):
            code = gradstore(argv)
        if code != 0:
            raise SystemExit(f"gradstore {' '.join(argv)} exited {code}")
        return json.loads(summary.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--seeds", type=seeds_arg, default=seeds_arg("0-7"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--local", action="store_true", help="the embedded node, not Kubo")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo", default=None)
    args = parser.parse_args()
    daemons = [] if args.local else start_daemons(kubo_binary(args.kubo), 1)
    plain: dict[tuple[Any, ...], Any] = {}  # (mode, model, extra, seed) -> summary
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            node_args = (
                ["--local", str(Path(tmp) / "node")]
                if args.local
                else ["--api", daemons[0].api_url]
            )
            for mode, model, extra, spec in CONFIGS:
                setting = (mode, model, extra)
                runs = []
                for seed in args.seeds:
                    if (*setting, seed) not in plain:
                        plain[(*setting, seed)] = run(node_args, args, setting, seed, None)
                    packed = run(node_args, args, setting, seed, spec)
                    runs.append((seed, plain[(*setting, seed)], packed))
                results.append((setting, spec, runs))
    finally:
        stop_all(daemons)
    rows = []
    out = []
    for (mode, model, extra), spec, runs in results:
        ratios = [p["input_bytes"] / c["input_bytes"] for _, p, c in runs]
        points = [100 * (c["accuracy"] - p["accuracy"]) for _, p, c in runs]
        plain_acc = statistics.mean(p["accuracy"] for _, p, _ in runs)
        packed_acc = statistics.mean(c["accuracy"] for _, _, c in runs)
        ok = min(ratios) >= 50 and statistics.mean(points) >= -2
        name = f"{mode} {model}{' ' + ' '.join(extra) if extra else ''}"
        rows.append([
            name, spec, f"{min(ratios):.1f}x", f"{plain_acc:.2%}", f"{packed_acc:.2%}",
            f"{statistics.mean(points):+.2f}", f"{min(points):+.2f}", "ok" if ok else "MISSED",
        ])  # fmt: skip
        out.append({
            "config": name, "spec": spec,
            "runs": [{"seed": s, "plain": p, "compressed": c} for s, p, c in runs],
        })  # fmt: skip
    if args.json:
        dump_json({"machine": machine(), "seeds": args.seeds, "rounds": args.rounds, "runs": out})
        return
    print(
        f"gradstore demo, {args.peers} peers, {args.rounds} rounds, seeds "
        f"{','.join(map(str, args.seeds))}, compressed vs none; "
        f"{'local node' if args.local else 'Kubo'}"
    )
    headers = ["settings", "spec", "fewer", "accuracy", "compressed", "mean pts", "worst pts"]
    print(table([*headers, "target"], rows))


if __name__ == "__main__":
    main()
