#!/usr/bin/env python3
"""Put and get of a 1 GiB float32 gradient, compressed with top-k (1.5%, int8 values) and not.

One run, one freshly started isolated Kubo daemon (own temporary repo, stopped at the
end). The gradient is --mib MiB of seeded N(0, 1) float32 in 16 tensors. For each kind:

  dense       put   GradientStore.put(g)                     (gradstore/1, streamed)
              get   GradientStore.get(cid)                   (every block hashed, decoded)
  compressed  put   compress(g, SPEC) + GradientStore.put     (both timed; compress also alone)
              get   fetch_document(cid) + decode_any          (every block hashed, every
                                                               payload rule checked; the
                                                               result decompresses on demand)

and the bytes each stores. Every repetition negates the gradient (every value, so every
block and every kept value is new), and between repetitions everything is unpinned and
`ipfs repo gc` runs (not timed). Times are the best and the median of --repeat.

    .venv/bin/python -m benchmarks compressed_store [--mib 1024] [--repeat 3]
        [--spec topk:0.015,values=int8] [--json] [--kubo PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import numpy as np

from benchmarks._common import MiB, dump_json, kubo_binary, machine, start_daemons, table
from gradstore.compress import compress
from gradstore.format import CompressedGradient, Gradient, Limits, decode_any, encode
from gradstore.node import KuboDaemon, stop_all
from gradstore.store import GradientStore

SEED = 20270202
TENSORS = 16


def gradient(mib: int) -> Gradient:
    """--mib MiB of float32 in ``TENSORS`` tensors."""
    rng = np.random.default_rng(SEED)
    per = mib * MiB // 4 // TENSORS
    return Gradient(
        {
            f"layer{i:02d}.weight": rng.standard_normal(per, dtype=np.float32)
            for i in range(TENSORS)
        },
        {"kind": "gradient"},
    )


async def measure(daemon: KuboDaemon, args: argparse.Namespace) -> dict[str, Any]:
    g = gradient(args.mib)
    dense_bytes = sum(a.nbytes for a in g.tensors.values())
    node = daemon.node()
    store = GradientStore(node, limits=Limits(max_bytes=2 * dense_bytes, max_elements=dense_bytes))
    times: dict[str, list[float]] = {
        k: [] for k in ("dense put", "dense get", "compress", "compressed put", "compressed get")
    }
    sizes: dict[str, int] = {}
    try:
        for _ in range(args.repeat):
            for a in g.tensors.values():
                np.negative(a, out=a)  # every value new: new blocks, new kept values
            t = time.perf_counter()
            cid = await store.put(g)
            times["dense put"].append(time.perf_counter() - t)
            sizes["dense"] = encode(g).size
            t = time.perf_counter()
            back = await store.get(cid)
            times["dense get"].append(time.perf_counter() - t)
            assert (
                back.tensors["layer00.weight"][:4].tobytes()
                == g.tensors["layer00.weight"][:4].tobytes()
            )
            del back

            t = time.perf_counter()
            c = compress(g, args.spec)
            spent = time.perf_counter() - t
            times["compress"].append(spent)
            t = time.perf_counter()
            ccid = await store.put(c)
            times["compressed put"].append(spent + time.perf_counter() - t)
            sizes["compressed"] = encode(c).size
            t = time.perf_counter()
            got = decode_any(await store.fetch_document(ccid), store.limits)
            times["compressed get"].append(time.perf_counter() - t)
            assert isinstance(got, CompressedGradient) and got == c
            for done in (cid, ccid):
                await node.unpin(done)
            daemon.run("repo", "gc", "--quiet", timeout=600)
    finally:
        await node.aclose()
    return {"times": times, "bytes": sizes, "dense_bytes": dense_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spec", default="topk:0.015,values=int8")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo", default=None)
    args = parser.parse_args()
    daemons = start_daemons(kubo_binary(args.kubo), 1)
    try:
        result = asyncio.run(measure(daemons[0], args))
    finally:
        stop_all(daemons)
    times, sizes = result["times"], result["bytes"]
    if args.json:
        dump_json({"machine": machine(), "mib": args.mib, "spec": args.spec, **result})
        return
    rows = []
    for name, ts in times.items():
        kind = "compressed" if name != "dense put" and name != "dense get" else "dense"
        mbps = result["dense_bytes"] / 1e6 / min(ts)
        rows.append([name, f"{min(ts):.2f}", f"{statistics.median(ts):.2f}", f"{mbps:.0f}", kind])
    print(f"{args.mib} MiB float32 in {TENSORS} tensors, {args.spec}, best/median of {args.repeat}")
    print(f"{machine()}")
    print(table(["operation", "best s", "median s", "MB/s of dense", "document"], rows))
    print(
        f"bytes stored: dense {sizes['dense']:,}, compressed {sizes['compressed']:,} "
        f"({sizes['dense'] / sizes['compressed']:.1f}x fewer)"
    )


if __name__ == "__main__":
    main()
