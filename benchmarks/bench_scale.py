#!/usr/bin/env python3
"""A round at model scale: spill files against reading inputs back from Kubo, beside `get`.

One Kubo daemon (the peers store on the coordinator's node, so the disk holds one copy of
the inputs, plus the spill). Each of --peers peers stores a gradient of --mib MiB (seeded,
made and stored one at a time; --dtype, --compress a codec spec), then a plain
``GradientStore.get`` of the first, middle and last inputs measures what one `gradstore
get` achieves from this daemon (the median of the three: one get varies by 15% from run
to run). Then one coordinator process per way, one after the other in the same run,
each on its own state folder, runs the round from the same announcements:

  spill    the default: each input's verified bytes are
           written to the coordinator's spill file while it is verified, and the
           aggregation pass reads them back
  re-read  spill=False (--no-spill): the aggregation pass
           reads every input back from Kubo by large ranges read ahead, every leaf hashed
           again (the stats' read_requests: how many ranged cats)

Reported per way: the round's seconds (first announcement to published aggregate), the
verification pass (the inputs' bytes over the time until the last was verified) against
`get`'s MB/s, the aggregation pass's MB/s, the coordinator's peak RSS (VmHWM, read from
/proc), the spill folder's peak size and the Kubo repository's.

    .venv/bin/python -m benchmarks scale [--peers 16] [--mib 1024] [--method fedavg]
        [--dtype float32] [--compress SPEC] [--only spill|re-read] [--audit] [--json]
        [--kubo PATH] [--profile DIR]

GRADSTORE_BENCH_LOG=1 logs each input's stages (waited, fetched, checked, pinned).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
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
    one_round_job,
    peak_rss_of,
    start_daemons,
    table,
)
from gradstore.compress import compress
from gradstore.coordinator import Coordinator
from gradstore.dag import CID
from gradstore.format import Gradient, numpy_dtype
from gradstore.job import JobConfig, load_job
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, KuboNode, stop_all
from gradstore.peer import Peer
from gradstore.store import GradientStore

SEED = 20261203
#: The re-read first, so that the spill run's writes cannot push Kubo's blocks out of the
#: page cache before it (at 16 x 1 GiB the order made no difference: 116 s after, 122 s before).
WAYS = ("re-read", "spill")


def make_job(n: int, method: str, max_bytes: int, path: Path) -> tuple[JobConfig, list[SigningKey]]:
    return one_round_job(n, method, max_bytes, path, name="bench-scale", seed=0xCA)


def serve(args: argparse.Namespace) -> None:
    """The coordinator process (``--serve``): one round, then its stats as JSON."""
    config = load_job(args.serve)
    key = SigningKey.load(Path(args.serve).with_suffix(".key"))
    if os.environ.get("GRADSTORE_BENCH_LOG"):  # each input's stages, the close's line
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        logging.getLogger("gradstore.coordinator").setLevel(logging.DEBUG)

    async def run() -> dict[str, Any]:
        node = KuboNode(args.api)
        try:
            coordinator = Coordinator(
                config, key, node, args.state, linger_s=0, spill=not args.no_spill
            )
            (outcome,) = await coordinator.run()
            return {
                "status": outcome.status,
                "output": str(outcome.output),
                "record": str(outcome.record),
                **outcome.stats,
            }
        finally:
            await node.aclose()

    print(json.dumps(asyncio.run(run())), flush=True)


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


#: Float32 elements per tensor: a tensor's bytes are one msgpack bin (at most 2^32 - 1), so a
#: gradient above 1 GiB is made of several tensors, as a model's is.
TENSOR_ELEMENTS = 1024 * MiB // 4


def _gradient(rng: np.random.Generator, mib: int, dtype: np.dtype[Any]) -> Gradient:
    """``mib`` MiB of float32 normals (in tensors of at most 1 GiB), cast to ``dtype``."""
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    left = mib * MiB // 4
    while left:
        values = np.empty(min(left, TENSOR_ELEMENTS), np.float32)
        rng.standard_normal(dtype=np.float32, out=values)
        name = "w" if not tensors else f"w{len(tensors)}"
        tensors[name] = values if dtype == np.float32 else values.astype(dtype)
        left -= values.size
    return Gradient(tensors)


async def store_inputs(
    daemon: KuboDaemon, config: JobConfig, peers: list[SigningKey], args: argparse.Namespace
) -> tuple[list[str], float, int]:
    """Each peer's gradient stored (one in memory at a time); then a `get` of the first,
    middle and last: the CIDs, the median get's seconds and the document's bytes."""
    cids = []
    rng = np.random.default_rng(SEED)
    dtype = numpy_dtype({"float32": "<f4", "float16": "<f2"}.get(args.dtype, args.dtype))
    if dtype is None:
        raise SystemExit(f"--dtype {args.dtype}: not a gradstore dtype")
    async with daemon.node() as node:
        for i, key in enumerate(peers):
            grad: Any = _gradient(rng, args.mib, dtype)
            if args.compress:
                grad = compress(grad, args.compress)
            async with Peer(config, node, key) as peer:
                cids.append(str(await peer.store.put(peer.prepare(grad, 0, 1 + i))))
            del grad
        store = GradientStore(node, limits=config.limits)
        rates: list[tuple[float, float, int]] = []  # (MB/s, seconds, bytes)
        for cid in dict.fromkeys([cids[0], cids[len(cids) // 2], cids[-1]]):
            t0 = time.perf_counter()
            view = await store.fetch_document(cid)
            got = await asyncio.to_thread(_decode, view, config)
            seconds = time.perf_counter() - t0
            rates.append((view.nbytes / seconds / 1e6, seconds, int(view.nbytes)))
            del view, got
        _, seconds, size = sorted(rates)[len(rates) // 2]
    return cids, seconds, size


def _decode(view: Any, config: JobConfig) -> Any:
    from gradstore.format import decode_any

    return decode_any(view, config.limits)


async def one_round(
    daemon: KuboDaemon,
    config: JobConfig,
    job: Path,
    peers: list[SigningKey],
    cids: list[str],
    tmp: Path,
    way: str,
    profile_dir: str | None = None,
) -> dict[str, Any]:
    state = tmp / f"{way}-state"
    profile = (
        ["-m", "cProfile", "-o", str(Path(profile_dir) / f"{way}.prof")] if profile_dir else []
    )
    cmd = [
        sys.executable, *profile, "-m", "benchmarks.bench_scale", "--serve", str(job),
        "--api", daemon.api_url, "--state", str(state),
    ]  # fmt: skip
    if way == "re-read":
        cmd.append("--no-spill")
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak = spill_peak = 0
    try:
        deadline = time.monotonic() + 60
        async with daemon.node() as node:
            while config.gradients_topic not in await node.pubsub_topics():
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("the coordinator did not start")
                await asyncio.sleep(0.1)

            async def announce(i: int) -> None:
                async with Peer(config, node, peers[i]) as peer:
                    await peer.announce(CID.parse(cids[i]), 0, 1 + i, wait=False)

            t0 = time.perf_counter()
            await asyncio.gather(*(announce(i) for i in range(len(peers))))
            last_du = 0.0
            while process.poll() is None:
                peak = max(peak, peak_rss_of(process.pid))
                if time.monotonic() - last_du > 0.5:
                    spill_peak = max(spill_peak, _du(state / "spill"))
                    last_du = time.monotonic()
                await asyncio.sleep(0.05)
            wall = time.perf_counter() - t0
        out, _ = process.communicate()
        stats = json.loads(out.strip().splitlines()[-1])
        if stats["status"] != "closed":
            raise SystemExit(f"{way}: the round did not close: {stats}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    left = _du(state / "spill")
    shutil.rmtree(state, ignore_errors=True)
    return {
        "peak_rss": peak,
        "wall_s": wall,
        "spill_peak": spill_peak,
        "spill_left": left,
        "stats": stats,
    }


def audit(daemon: KuboDaemon, record: str, coordinator: str, max_bytes: int) -> dict[str, Any]:
    """``gradstore audit round`` of the round's record, as a user runs it: seconds, peak RSS."""
    cmd = [
        sys.executable, "-m", "gradstore", "audit", "round", record,
        "--coordinator", coordinator, "--api", daemon.api_url, "--max-bytes", str(max_bytes),
    ]  # fmt: skip
    t0 = time.perf_counter()
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while process.poll() is None:
        peak = max(peak, peak_rss_of(process.pid))
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    out, err = process.communicate()
    if process.returncode != 0:  # reported: the rounds' figures are not lost
        return {"seconds": seconds, "peak_rss": peak, "failed": err[-2000:]}
    return {"seconds": seconds, "peak_rss": peak, "out": out.strip().splitlines()[-1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--peers", type=int, default=16)
    parser.add_argument("--mib", type=int, default=1024, help="float32 MiB made per peer")
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    parser.add_argument("--compress", help="a codec spec, e.g. topk:0.015")
    parser.add_argument("--only", choices=WAYS)
    parser.add_argument("--audit", action="store_true", help="then `audit round` the spill run's")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo")
    parser.add_argument(
        "--profile", metavar="DIR", help="run each coordinator under cProfile, <way>.prof in DIR"
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--api", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--no-spill", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    binary = kubo_binary(args.kubo)
    runs: dict[str, Any] = {}
    (daemon,) = start_daemons(binary, 1)
    try:
        with tempfile.TemporaryDirectory(prefix="gradstore-bench-scale-") as name:
            tmp = Path(name)
            job = tmp / "job.toml"
            config, peers = make_job(args.peers, args.method, args.mib * MiB + MiB, job)
            t0 = time.perf_counter()
            cids, get_s, size = asyncio.run(store_inputs(daemon, config, peers, args))
            put_s = time.perf_counter() - t0
            repo = _du(Path(daemon.repo))
            for way in WAYS if args.only is None else (args.only,):
                runs[way] = asyncio.run(
                    one_round(daemon, config, job, peers, cids, tmp, way, args.profile)
                )
                if args.audit and way == "spill":
                    record = runs[way]["stats"]["record"]
                    limit = args.mib * MiB + MiB
                    runs["audit"] = audit(daemon, record, config.coordinator, limit)
    finally:
        stop_all([daemon])
    total = size * args.peers
    data = {
        "peers": args.peers,
        "mib": args.mib,
        "method": args.method,
        "dtype": args.dtype,
        "compress": args.compress,
        "document_bytes": size,
        "put_s": put_s,
        "get_s": get_s,
        "get_mb_s": size / get_s / 1e6,
        "kubo_repo_bytes": repo,
        "machine": machine(),
        "runs": runs,
    }
    if args.json:
        dump_json(data)
        return
    rows = []
    for way, r in runs.items():
        if way == "audit":
            continue
        s = r["stats"]
        close = s.get("close_s", 0.0)
        verify_s = max(1e-9, s.get("started_s", r["wall_s"]) - close)
        aggregate_s = max(1e-9, s.get("aggregate_s", 0.0))
        verify_rate = total / verify_s / 1e6
        rows.append(
            [
                way,
                f"{s.get('started_s', 0):.1f}",
                f"{verify_s:.1f}",
                f"{verify_rate:,.0f}",
                f"{verify_rate / data['get_mb_s']:.2f}",
                f"{aggregate_s:.1f}",
                f"{total / aggregate_s / 1e6:,.0f}",
                f"{total / aggregate_s / 1e6 / data['get_mb_s']:.2f}",
                f"{r['peak_rss'] / MiB:,.0f}",
                f"{r['spill_peak'] / MiB:,.0f}",
                f"{s.get('read_requests', 0):,}",
            ]
        )
    what = args.dtype + (f", {args.compress}" if args.compress else "")
    print(
        f"{args.peers} peers x {size / MiB:,.0f} MiB documents ({what}), {args.method}; one Kubo "
        f"daemon (repo {repo / MiB:,.0f} MiB); get {data['get_mb_s']:,.0f} MB/s (median of 3); "
        f"load {data['machine']['loadavg']}\n"
    )
    print(
        table(
            [
                "way",
                "round s",
                "verify s",
                "verify MB/s",
                "vs get",
                "aggregate s",
                "aggregate MB/s",
                "vs get",
                "peak RSS MiB",
                "spill MiB",
                "cats",
            ],
            rows,
        )
    )
    if "audit" in runs:
        a, spill = runs["audit"], runs["spill"]["stats"]
        if "failed" in a:
            print(f"\naudit round failed: {a['failed']}")
        print(
            f"\naudit round: {a['seconds']:.1f} s ({a['seconds'] / spill['started_s']:.2f}x the "
            f"spill round's), peak RSS {a['peak_rss'] / MiB:,.0f} MiB"
        )


if __name__ == "__main__":
    main()
