#!/usr/bin/env python3
"""How fast are GradientStore.put/get against Kubo's own `ipfs add` / `ipfs cat` on the same node?

One run, one freshly started isolated Kubo daemon (own temporary repo, the
`unixfs-v1-2025` profile, stopped at the end). For a float32 gradient of --mib MiB:

  encode        format.encode(g)                    (lazy: header + views of the arrays)
  local CID     dag.file_cid(encode(g))             (no node; chunk + sha256 in 2 threads)
  put           GradientStore.put(g)                (one pass: leaves streamed to dag/import as they
                                                     are hashed, then the dag-pb nodes; the root by
                                                     dag/put --pin, so Kubo does not walk the DAG)
  get+verify    GradientStore.get(cid)              (dag-pb nodes by block/get, leaves by cat into one
                                                     buffer, every block hashed, decoded)

next to the reference on documents of the same size:

  ipfs add CLI  `ipfs add -Q --pin=true FILE` of the document file (process start included)
  add RPC       KuboNode.add_bytes(document pieces, pin=True) in this process
  ipfs cat CLI  `ipfs cat CID > /dev/null` of put's CID (process start included)
  cat RPC       KuboNode.cat(CID) drained in this process

Every write gets fresh blocks: each repetition and each writer uses its own
variant of the gradient (a different value every 256 KiB, so every 1 MiB chunk
differs), and between repetitions everything is unpinned and `ipfs repo gc`
runs (not timed). The three writes, and then the three reads, run in an order
rotated each repetition (no side always goes first, right after a gc or a
write); the reads follow one untimed warm-up read. Times are the best
and the median of --repeat (the machine is noisy: both are shown). Ratios are
ours / reference time (<= 1.25 is the target, judged on the best).

Peak RSS is measured in a child process per operation: after the gradient is
created (put) or before anything is fetched (get), the child resets its
high-water mark (`echo 5 > /proc/self/clear_refs`), runs the operation once and
reads VmHWM. "extra" is the peak minus the RSS at the reset; "with payload"
adds the payload the operation holds anyway (put: the gradient it was given;
get: already inside the peak, since get allocates the result). Targets: put
<= 1.5x payload, get <= 2x payload (the "with payload" column).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m benchmarks store
    options: --mib 256 --repeat 3 --json --no-rss --kubo PATH
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
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
    peak_rss,
    reset_peak_rss,
    start_daemons,
    table,
)
from gradstore.dag import CID, file_cid
from gradstore.format import Gradient, Limits, encode
from gradstore.node import KuboDaemon, KuboNode
from gradstore.store import GradientStore

SEED = 20250917
STRIDE = 65536  # float32 elements between the values a variant changes (256 KiB)
TARGETS = {"put_ratio": 1.25, "get_ratio": 1.25, "cid_mbps": 1000.0, "put_rss": 1.5, "get_rss": 2.0}


class Variants:
    """One seeded float32 gradient; ``next()`` rewrites every 256 KiB so all 1 MiB chunks are new."""

    def __init__(self, mib: int, seed: int = SEED) -> None:
        self.array = np.empty(mib * MiB // 4, dtype=np.float32)
        np.random.default_rng(seed).standard_normal(dtype=np.float32, out=self.array)
        self.count = 0

    def next(self) -> Gradient:
        self.count += 1
        self.array[::STRIDE] = np.float32(self.count)
        return Gradient({"grad": self.array}, {"kind": "gradient", "round": self.count})


def limits_for(size: int) -> Limits:
    return Limits(max_bytes=size + MiB, max_elements=size)


async def measure(daemon: KuboDaemon, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    variants = Variants(args.mib)
    times: dict[str, list[float]] = {
        k: [] for k in ("encode", "cid", "put", "add_cli", "add_rpc", "get", "cat_cli", "cat_rpc")
    }
    node = daemon.node()
    store = GradientStore(node)
    state: dict[str, Any] = {}

    async def put() -> None:
        g = variants.next()
        state["mark"] = variants.count
        t = time.perf_counter()
        doc = encode(g)
        times["encode"].append(time.perf_counter() - t)
        state["size"] = doc.size
        store.limits = limits_for(doc.size)
        t = time.perf_counter()
        local = file_cid(encode(g))
        times["cid"].append(time.perf_counter() - t)
        t = time.perf_counter()
        cid = await store.put(g)
        times["put"].append(time.perf_counter() - t)
        if cid != local:
            raise SystemExit(f"put returned {cid}, local CID is {local}")
        state["cid"] = cid

    async def add_cli() -> None:  # the document file was written beforehand
        t = time.perf_counter()
        out = daemon.run("add", "-Q", "--pin=true", str(state["path"]), timeout=600)
        times["add_cli"].append(time.perf_counter() - t)
        added = CID.parse(out.stdout.decode().strip())
        if added != state["file_cid"]:
            raise SystemExit(f"ipfs add gave {added}, local CID is {state['file_cid']}")
        state["added_cli"] = added

    async def add_rpc() -> None:
        ref = variants.next()
        expected = file_cid(encode(ref))
        t = time.perf_counter()
        added = await node.add_bytes(encode(ref), pin=True)
        times["add_rpc"].append(time.perf_counter() - t)
        if added != expected:
            raise SystemExit(f"add RPC gave {added}, local CID is {expected}")
        state["added_rpc"] = added

    async def get() -> None:
        t = time.perf_counter()
        back = await store.get(state["cid"])
        times["get"].append(time.perf_counter() - t)
        got = back.tensors["grad"]
        if got.size != args.mib * MiB // 4 or not np.all(got[::STRIDE] == state["mark"]):
            raise SystemExit("get returned different data")

    async def cat_cli() -> None:
        t = time.perf_counter()
        subprocess.run(
            [str(daemon.binary), "cat", str(state["cid"])],
            env=daemon._env(),
            stdout=subprocess.DEVNULL,
            check=True,
            timeout=600,
        )
        times["cat_cli"].append(time.perf_counter() - t)

    async def cat_rpc() -> float:
        t = time.perf_counter()
        n = 0
        async for chunk in node.cat(state["cid"]):
            n += len(chunk)
        if n != state["size"]:
            raise SystemExit(f"cat returned {n} bytes, expected {state['size']}")
        return time.perf_counter() - t

    async def timed_cat_rpc() -> None:
        times["cat_rpc"].append(await cat_rpc())

    writes = [put, add_cli, add_rpc]
    reads = [get, cat_cli, timed_cat_rpc]
    try:
        for r in range(args.repeat):
            # the CLI's document file, a fresh variant, written before any timing
            ref = variants.next()
            state["path"] = tmp / f"doc-{r}.bin"
            with open(state["path"], "wb") as f:
                encode(ref).write_to(f)
            state["file_cid"] = file_cid(encode(ref))
            # writes then reads, each in a rotated order so no side is always first
            for op in writes[r % 3 :] + writes[: r % 3]:
                await op()
            state["path"].unlink()
            await cat_rpc()  # warm-up read of put's CID (not timed)
            for op in reads[r % 3 :] + reads[: r % 3]:
                await op()
            # fresh blocks next time: drop everything (not timed)
            for c in (state["cid"], state["added_cli"], state["added_rpc"]):
                await node.unpin(c)
            daemon.run("repo", "gc", "--quiet", timeout=600)
        last = await store.put(variants.next())  # left pinned for the get RSS probe
    finally:
        await node.aclose()
    return {"size": state["size"], "times": times, "probe_cid": str(last)}


# --- peak RSS (child processes) -------------------------------------------------------------------


def rss_child(op: str, api: str, mib: int, cid: str | None) -> None:
    """Run one put or get in this (fresh) process and print 'extra_bytes payload_bytes'."""

    async def run() -> tuple[int, int]:
        node = KuboNode(api)
        try:
            if op == "put":
                g = Variants(mib, seed=SEED + 1).next()
                size = encode(g).size
                store = GradientStore(node, limits=limits_for(size))
                await node.version()  # connection and imports warm before the reset
                base = reset_peak_rss()
                await store.put(g)
                return peak_rss() - base, size
            assert cid is not None
            store = GradientStore(node, limits=limits_for(mib * MiB + MiB))
            await node.version()
            base = reset_peak_rss()
            back = await store.get(cid)
            extra = peak_rss() - base
            return extra, int(sum(a.nbytes for a in back.tensors.values()))
        finally:
            await node.aclose()

    extra, payload = asyncio.run(run())
    print(extra, payload)


def measure_rss(daemon: KuboDaemon, mib: int, probe_cid: str) -> dict[str, dict[str, float]]:
    result: dict[str, dict[str, float]] = {}
    for op in ("put", "get"):
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.bench_store",
            "--rss-child",
            op,
            "--api",
            daemon.api_url,
            "--mib",
            str(mib),
        ]
        if op == "get":
            cmd += ["--cid", probe_cid]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900)
        extra, payload = (int(x) for x in out.stdout.split())
        held = payload if op == "put" else 0  # put's input is held anyway; get's output is in extra
        result[op] = {
            "extra_mib": extra / MiB,
            "payload_mib": payload / MiB,
            "extra_x": extra / payload,
            "with_payload_x": (extra + held) / payload,
        }
    return result


# --- report ---------------------------------------------------------------------------------------


def report(data: dict[str, Any]) -> str:
    size = data["size"]
    best = {k: min(v) for k, v in data["times"].items()}
    median = {k: statistics.median(v) for k, v in data["times"].items()}
    mb = size / 1e6

    def row(name: str, key: str, ref: str | None = None) -> list[str]:
        s, m = best[key], median[key]
        ratio = f"{s / best[ref]:.2f}" if ref else ""
        median_ratio = f"{m / median[ref]:.2f}" if ref else ""
        return [name, f"{s:.3f}", f"{mb / s:,.0f}", ratio, f"{m:.3f}", median_ratio]

    lines = [
        f"document {size:,} bytes ({size / MiB:.1f} MiB), best of {data['repeat']}, "
        f"Kubo {data['kubo']}, load {data['machine']['loadavg']}",
        "",
        table(
            ["operation", "best s", "MB/s", "ours/ref", "median s", "median ours/ref"],
            [
                row("encode (lazy)", "encode"),
                row("local CID", "cid"),
                row("put", "put", "add_cli"),
                row("  vs add RPC", "put", "add_rpc"),
                row("ipfs add CLI", "add_cli"),
                row("add RPC", "add_rpc"),
                row("get+verify", "get", "cat_cli"),
                row("  vs cat RPC", "get", "cat_rpc"),
                row("ipfs cat CLI", "cat_cli"),
                row("cat RPC", "cat_rpc"),
            ],
        ),
    ]
    rss = data.get("rss")
    if rss:
        lines += [
            "",
            "peak RSS (child process; VmHWM reset after the gradient exists, then one operation)",
            table(
                [
                    "operation",
                    "extra MiB",
                    "payload MiB",
                    "extra/payload",
                    "with payload",
                    "target",
                ],
                [
                    [
                        op,
                        f"{v['extra_mib']:.1f}",
                        f"{v['payload_mib']:.1f}",
                        f"{v['extra_x']:.2f}x",
                        f"{v['with_payload_x']:.2f}x",
                        f"<= {TARGETS[op + '_rss']}x",
                    ]
                    for op, v in rss.items()
                ],
            ),
        ]
    checks = data["checks"]
    lines += [
        "",
        "targets: " + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in checks.items()),
    ]
    return "\n".join(lines)


def check_targets(data: dict[str, Any]) -> dict[str, bool]:
    best = {k: min(v) for k, v in data["times"].items()}
    checks = {
        "put <= 1.25x ipfs add": best["put"] <= TARGETS["put_ratio"] * best["add_cli"],
        "get <= 1.25x ipfs cat": best["get"] <= TARGETS["get_ratio"] * best["cat_cli"],
        "local CID >= 1 GB/s": data["size"] / best["cid"] / 1e6 >= TARGETS["cid_mbps"],
    }
    rss = data.get("rss")
    if rss:
        checks["put RSS <= 1.5x"] = rss["put"]["with_payload_x"] <= TARGETS["put_rss"]
        checks["get RSS <= 2x"] = rss["get"]["with_payload_x"] <= TARGETS["get_rss"]
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=256, help="gradient size in MiB (float32)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; the best is reported")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS child processes")
    parser.add_argument("--kubo", help="Kubo binary (default: $GRADSTORE_KUBO, PATH, cache)")
    parser.add_argument("--rss-child", choices=("put", "get"), help=argparse.SUPPRESS)
    parser.add_argument("--api", help=argparse.SUPPRESS)
    parser.add_argument("--cid", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child(args.rss_child, args.api, args.mib, args.cid)
        return

    binary = kubo_binary(args.kubo)
    (daemon,) = start_daemons(binary, 1)
    try:
        version = daemon.run("version", "--number").stdout.decode().strip()
        with tempfile.TemporaryDirectory(prefix="gradstore-bench-") as tmp:
            data = asyncio.run(measure(daemon, args, Path(tmp)))
        if not args.no_rss:
            data["rss"] = measure_rss(daemon, args.mib, data.pop("probe_cid"))
    finally:
        daemon.stop()
    data.pop("probe_cid", None)
    data.update(repeat=args.repeat, kubo=version, binary=str(binary), machine=machine())
    data["checks"] = check_targets(data)
    if args.json:
        data["targets"] = TARGETS
        dump_json(data)
    else:
        print(report(data))


if __name__ == "__main__":
    main()
