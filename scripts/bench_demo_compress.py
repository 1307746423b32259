#!/usr/bin/env python3
"""The demo with and without compression, same settings, side by side: bytes moved, accuracy.

Each configuration runs `gradstore demo` twice on one freshly started Kubo daemon (or
--local): once uncompressed and once with --compress SPEC, everything else equal (seed,
peers, rounds, model). Each run's --summary-json gives ``bytes_moved`` (the bytes of all
documents the peers stored over the run) and ``accuracy`` (held-out, after the last
round). Targets: at least 50x fewer bytes_moved, accuracy within 2 points.

    .venv/bin/python scripts/bench_demo_compress.py [--spec topk:0.015,values=int8]
        [--rounds 20] [--peers 4] [--local] [--json] [--kubo PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import dump_json, kubo_binary, machine, start_daemons, table
from gradstore.cli import main as gradstore
from gradstore.node.daemon import stop_all

#: (mode, model, extra demo options, which override the defaults): the default demo (MLP,
#: 64 hidden units) in both modes, the softmax model (the default before issue 11), a wider
#: MLP, and data-parallel training over more rounds (one SGD step per round).
CONFIGS: list[tuple[str, str, list[str]]] = [
    ("federated", "mlp", []),
    ("federated", "softmax", []),
    ("federated", "mlp", ["--hidden", "128"]),
    ("data-parallel", "mlp", []),
    ("data-parallel", "mlp", ["--rounds", "60"]),
]


def run(node_args: list[str], args: argparse.Namespace, config: Any, spec: str | None) -> Any:
    mode, model, extra = config
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        argv = [
            "demo", *node_args, "--quiet", "--mode", mode, "--model", model,
            "--peers", str(args.peers), "--rounds", str(args.rounds), "--seed", str(args.seed),
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
    parser.add_argument("--spec", default="topk:0.015,values=int8")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--local", action="store_true", help="the embedded node, not Kubo")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo", default=None)
    args = parser.parse_args()
    daemons = [] if args.local else start_daemons(kubo_binary(args.kubo), 1)
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            node_args = (
                ["--local", str(Path(tmp) / "node")]
                if args.local
                else ["--api", daemons[0].api_url]
            )
            for config in CONFIGS:
                plain = run(node_args, args, config, None)
                packed = run(node_args, args, config, args.spec)
                results.append((config, plain, packed))
    finally:
        stop_all(daemons)
    rows = []
    out = []
    for (mode, model, extra), plain, packed in results:
        ratio = plain["bytes_moved"] / packed["bytes_moved"]
        points = 100 * (packed["accuracy"] - plain["accuracy"])
        ok = ratio >= 50 and points >= -2
        name = f"{mode} {model}{' ' + ' '.join(extra) if extra else ''}"
        rows.append([
            name, f"{plain['bytes_moved']:,}", f"{packed['bytes_moved']:,}", f"{ratio:.1f}x",
            f"{plain['accuracy']:.2%}", f"{packed['accuracy']:.2%}", f"{points:+.2f}",
            "ok" if ok else "MISSED",
        ])  # fmt: skip
        out.append({"config": name, "plain": plain, "compressed": packed, "ratio": ratio})
    if args.json:
        dump_json({"machine": machine(), "spec": args.spec, "rounds": args.rounds, "runs": out})
        return
    print(
        f"gradstore demo, {args.peers} peers, {args.rounds} rounds, seed {args.seed}, "
        f"--compress {args.spec} vs none; {'local node' if args.local else 'Kubo'}"
    )
    headers = ["settings", "bytes_moved", "compressed", "fewer", "accuracy", "compressed"]
    print(table([*headers, "points", "target"], rows))


if __name__ == "__main__":
    main()
