#!/usr/bin/env python3
"""How fast are the codecs on 25M float32 (100 MB), next to aggregating the same input dense?

In one run, on one core, for a seeded N(0, 1) float32 gradient of --elements elements:

  int8 compress              compress_array(x, int8:4096)            (numba kernel)
  int8 decompress            CompressedTensor.read into a float64 buffer
  int8 decompress+accumulate read 1M-element blocks, add into a float64 accumulator
  topk compress              compress_array(x, topk:0.015,values=int8) (61 of every 4096)
  topk decompress+accumulate CompressedTensor.sparse, then acc[positions] += values

next to the reference on the same input:

  dense accumulate           np.add(acc, x, out=acc): what adding an uncompressed float32
                             input into the float64 accumulator costs (the streamed engine)
  copy                       np.copyto of the float32 input (memory bandwidth)

Figures are GB/s of float32 input (decimal GB), best of --repeat, and the ratio to dense
accumulate (> 1: faster than adding the dense input). Targets: int8 compress and
decompress >= 1 GB/s; topk compress >= 0.5 GB/s; topk decompress+accumulate >= 2 GB/s.

    .venv/bin/python -m benchmarks codecs [--elements 25000000] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks._common import dump_json, machine, table
from gradstore.compress import compress_array, parse_spec

SEED = 20270201
BLOCK = 1 << 20
TARGETS = {
    "int8 compress": 1.0,
    "int8 decompress": 1.0,
    "topk compress": 0.5,
    "topk decompress+accumulate": 2.0,
}


def best(work: Callable[[], Any], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``work`` (after one untimed warm-up)."""
    work()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--elements", type=int, default=25_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    n = args.elements
    x = np.random.default_rng(SEED).standard_normal(n, dtype=np.float32)
    gb = x.nbytes / 1e9
    acc = np.zeros(n)
    scratch = np.empty(n, np.float32)
    out = np.empty(n)
    int8 = parse_spec("int8")
    topk = parse_spec("topk:0.015,values=int8")
    t8 = compress_array(x, int8, "x")
    tk = compress_array(x, topk, "x")

    def int8_accumulate() -> None:
        for lo in range(0, n, BLOCK):
            hi = min(n, lo + BLOCK)
            a = acc[lo:hi]
            np.add(a, t8.read(lo, hi, out[: hi - lo]), out=a)

    def topk_accumulate() -> None:
        positions, values = tk.sparse(0, n)
        acc[positions] += values

    runs: dict[str, Callable[[], Any]] = {
        "dense accumulate (reference)": lambda: np.add(acc, x, out=acc),
        "copy (reference)": lambda: np.copyto(scratch, x),
        "int8 compress": lambda: compress_array(x, int8, "x"),
        "int8 decompress": lambda: t8.read(0, n, out),
        "int8 decompress+accumulate": int8_accumulate,
        "topk compress": lambda: compress_array(x, topk, "x"),
        "topk decompress+accumulate": topk_accumulate,
    }
    seconds = {name: best(work, args.repeat) for name, work in runs.items()}
    reference = seconds["dense accumulate (reference)"]
    rows = []
    results: dict[str, Any] = {}
    for name, s in seconds.items():
        rate = gb / s
        target = TARGETS.get(name)
        verdict = "" if target is None else ("ok" if rate >= target else "MISSED")
        rows.append(
            [name, f"{s * 1000:.1f}", f"{rate:.2f}", f"{reference / s:.2f}", target or "", verdict]
        )
        results[name] = {"seconds": s, "gbps": rate, "vs_dense_accumulate": reference / s}
    sizes = {
        "dense": x.nbytes,
        "int8": t8.nbytes,
        "topk:0.015,values=int8": tk.nbytes,
    }
    if args.json:
        dump_json({"machine": machine(), "elements": n, "results": results, "bytes": sizes})
        return
    print(f"{n:,} float32 ({x.nbytes / 1e6:.0f} MB), best of {args.repeat}; {machine()}")
    print(table(["operation", "ms", "GB/s", "x dense acc", "target", ""], rows))
    print(
        "payload bytes: "
        + ", ".join(f"{k} {v / 1e6:.2f} MB ({x.nbytes / v:.1f}x)" for k, v in sizes.items())
    )


if __name__ == "__main__":
    main()
