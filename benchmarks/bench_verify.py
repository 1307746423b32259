#!/usr/bin/env python3
"""What does verifying a small input cost? N stored documents verified as a coordinator does.

One freshly started isolated Kubo daemon holds --docs seeded float32 documents of --mib MiB
(their tensors' bytes), stored by this process. Then, for each way below, a process of its
own verifies every one of them, --workers at once (a coordinator's fetch workers), and
reports its CPU seconds, the Kubo daemon's over the same span, its wall time and its Kubo
requests by command (``GRADSTORE_RPC_COUNTS``'s counter):

  input       the coordinator's ``verify_input``: the root by ``block/get``, the leaves by
              ``cat`` (every block hashed), decode, check, pin (in batches), with a
              coordinator's budgets
  two         the requests alone, nothing hashed: ``block/get`` of the root, then ``cat``
  before      ``input`` with the gradstore of another checkout (``--before SRC``: its src)

The ways alternate for --repeat runs; the table gives medians. The figures are
load-independent where the wall time is not: CPU seconds per document, requests.

    .venv/bin/python -m benchmarks verify --docs 256 --mib 1 --repeat 3 --before ../main/src
    options: --ways before,input,two --workers 16 --json --kubo PATH
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import MiB, emit, kubo_binary, machine, start_daemons, table
from gradstore.dag import CID
from gradstore.format import Gradient
from gradstore.node import KuboNode, stop_all

SEED = 20261206
#: The ways a run can verify, as --ways names them.
WAYS = ("input", "two", "before")


def kubo_cpu_s(pid: int) -> float:
    """The Kubo daemon's CPU seconds (user + system) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def store_documents(api: str, docs: int, mib: int) -> list[CID]:
    """``docs`` seeded gradients of one float32 tensor of ``mib`` MiB, stored and pinned."""
    from gradstore.store import GradientStore

    rng = np.random.default_rng(SEED)
    cids = []
    async with KuboNode(api) as node:
        store = GradientStore(node)
        for _ in range(docs):
            a = rng.standard_normal(mib * MiB // 4, dtype=np.float32)
            cids.append(await store.put(Gradient({"g": a})))
    return cids


async def verify_all(args: argparse.Namespace, cids: list[CID]) -> dict[str, Any]:
    """The child's run: every CID verified ``args.way``, ``args.workers`` at once."""
    from gradstore.coordinator.inputs import ByteBudget, verify_input
    from gradstore.coordinator.pinner import BatchPinner
    from gradstore.dag.assemble import anonymous_buffer
    from gradstore.node.kubo.counts import REQUESTS
    from gradstore.store import GradientStore

    async with KuboNode(args.api) as node:
        store = GradientStore(node)
        budget, keep = ByteBudget(256 << 20), ByteBudget(128 << 20)
        pinner = BatchPinner(node)
        gate = asyncio.Semaphore(args.workers)

        async def one(cid: CID) -> None:
            async with gate:
                if args.way in ("input", "before"):
                    await verify_input(
                        node, store, "peer", cid, 1, expected=None, resolve_timeout_s=10.0,
                        budget=budget, keep=keep, clip=False, pinner=pinner,
                    )  # fmt: skip
                else:
                    root = await node.get_block(cid)
                    buf = anonymous_buffer(args.mib * MiB + (64 << 10))
                    await node.cat_into(cid, buf)
                    del root

        REQUESTS.clear()
        kubo, cpu, wall = kubo_cpu_s(args.kubo_pid), time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(c) for c in cids))
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        kubo = kubo_cpu_s(args.kubo_pid) - kubo
        return {
            "way": args.way,
            "wall_s": wall,
            "cpu_s": cpu,
            "kubo_cpu_s": kubo,
            "requests": dict(REQUESTS),
        }


def child(args: argparse.Namespace) -> None:
    cids = [CID.parse(c) for c in Path(args.cids).read_text().split()]
    print(json.dumps(asyncio.run(verify_all(args, cids))))


def run_child(args: argparse.Namespace, way: str, api: str, pid: int, cids: Path) -> dict[str, Any]:
    """One run of ``way`` in a process of its own (its imports and start are not counted)."""
    env = dict(os.environ)
    if way == "before":
        env["PYTHONPATH"] = os.pathsep.join([args.before, str(Path(__file__).parent.parent)])
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_verify", "--child", "--way", way,
         "--api", api, "--kubo-pid", str(pid), "--cids", str(cids), "--mib", str(args.mib),
         "--workers", str(args.workers)],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def report(data: dict[str, Any]) -> str:
    runs, docs = data["runs"], data["docs"]
    rows = []
    for way in data["ways"]:
        mine = [r for r in runs if r["way"] == way]
        cpu = statistics.median(r["cpu_s"] for r in mine)
        kubo = statistics.median(r["kubo_cpu_s"] for r in mine)
        requests = ", ".join(f"{k} {v}" for k, v in sorted(mine[0]["requests"].items()))
        rows.append(
            [
                way,
                f"{statistics.median(r['wall_s'] for r in mine):.2f}",
                " ".join(f"{r['cpu_s']:.2f}" for r in mine),
                f"{cpu * 1000 / docs:.2f}",
                " ".join(f"{r['kubo_cpu_s']:.2f}" for r in mine),
                f"{kubo * 1000 / docs:.2f}",
                requests,
            ]
        )
    head = (
        f"{docs} documents of {data['mib']} MiB verified {data['workers']} at once, one Kubo "
        f"{data['kubo']} daemon, the verifier in its own process, load {data['machine']['loadavg']}"
    )
    return (
        head
        + "\n\n"
        + table(
            [
                "way",
                "wall s",
                "CPU s (runs)",
                "ms/doc",
                "Kubo CPU s (runs)",
                "Kubo ms/doc",
                "requests",
            ],
            rows,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--docs", type=int, default=256)
    parser.add_argument("--mib", type=int, default=1, help="MiB of tensor bytes per document")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument(
        "--ways", default=None, help=f"of {','.join(WAYS)} (default before,input with --before)"
    )
    parser.add_argument("--before", help="the src folder of a checkout to compare with")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo", help="Kubo binary (default: $GRADSTORE_KUBO, PATH, cache)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--way", help=argparse.SUPPRESS)
    parser.add_argument("--api", help=argparse.SUPPRESS)
    parser.add_argument("--kubo-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    default = "before,input" if args.before else "input"
    ways = [w for w in (args.ways or default).split(",") if w]
    if unknown := set(ways) - set(WAYS):
        sys.exit(f"unknown ways {sorted(unknown)}: these are {', '.join(WAYS)}")
    if "before" in ways and not args.before:
        sys.exit(
            "the way 'before' needs --before SRC, the src folder of a checkout to compare with"
        )
    (daemon,) = start_daemons(kubo_binary(args.kubo), 1)
    runs = []
    try:
        version = daemon.run("version", "--number").stdout.decode().strip()
        assert daemon.pid is not None
        cids = asyncio.run(store_documents(daemon.api_url, args.docs, args.mib))
        with tempfile.TemporaryDirectory(prefix="gradstore-bench-verify-") as tmp:
            listing = Path(tmp) / "cids"
            listing.write_text("\n".join(str(c) for c in cids))
            for repeat in range(args.repeat):
                for way in ways if repeat % 2 == 0 else ways[::-1]:
                    runs.append(run_child(args, way, daemon.api_url, daemon.pid, listing))
    finally:
        stop_all([daemon])
    data = {
        "docs": args.docs,
        "mib": args.mib,
        "workers": args.workers,
        "ways": ways,
        "kubo": version,
        "machine": machine(),
        "runs": runs,
    }
    emit(data, args.json, report)


if __name__ == "__main__":
    main()
