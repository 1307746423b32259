#!/usr/bin/env python3
"""How fast are gradstore's aggregators, against the NumPy one-liners people would write?

For fedavg, median, trimmed_mean and krum over N inputs of SIZE float32 elements, time
``gradstore.aggregate`` and the naive stacked form side by side in one run, and print the
input throughput (GB/s of input read) and the speed-up. Targets: fedavg >= 5 GB/s,
median >= 1 GB/s, and >= 3x the naive form for each.

fedavg_exact is fedavg with ``accumulate = "exact"`` (each element's terms summed exactly,
rounded once: order- and grouping-independent); it has no target, and the table says how
many times fedavg's time it takes.

Naive forms:
  fedavg        np.average(np.stack(inputs), axis=0, weights=num_samples)
  fedavg_exact  the same
  median        np.median(np.stack(inputs), axis=0)
  trimmed_mean  np.sort(np.stack(inputs), axis=0)[k:n-k].mean(axis=0)
  krum          X = np.stack(inputs); |X[i] - X[j]|^2 for every pair, then Krum's scores

Memory: the inputs (N * SIZE * 4 bytes, generated once with a seeded generator and reused
for every N) plus, for the naive forms, a stacked copy and its sorted/partitioned copy: the
default 32 x 25M run needs about 12 GB. OpenBLAS settings in the environment can slow
NumPy down; run as
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m benchmarks aggregate
Quick run: ``--inputs 8 --sizes 25000000`` (or ``--sizes 4000000``).
fedavg runs gradstore's numba kernel when numba loads; ``GRADSTORE_NUMBA=0`` times the
NumPy path instead (same bits). The first call compiles or loads it: ours is best of --repeat.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gradstore.aggregate import AggregationParams, _fused, aggregate, aggregate_with_info

METHODS = ("fedavg", "fedavg_exact", "median", "trimmed_mean", "krum")
TARGET_GBPS = {"fedavg": 5.0, "median": 1.0}
TARGET_RATIO = 3.0
SEED = 20250101


def trim_ratio_for(n: int) -> float:
    """An eighth of the inputs trimmed per side (1 of 8, 4 of 32), at least one."""
    return max(1, n // 8) / n


def byzantine_for(n: int) -> int:
    """The largest f Krum tolerates with n inputs (n >= 2f + 3)."""
    return (n - 3) // 2


def naive_fedavg(arrays: list[np.ndarray], counts: list[int]) -> np.ndarray:
    result: np.ndarray = np.average(np.stack(arrays), axis=0, weights=counts)
    return result


def naive_median(arrays: list[np.ndarray]) -> np.ndarray:
    result: np.ndarray = np.median(np.stack(arrays), axis=0)
    return result


def naive_trimmed_mean(arrays: list[np.ndarray], k: int) -> np.ndarray:
    ordered = np.sort(np.stack(arrays), axis=0)
    result: np.ndarray = ordered[k : len(arrays) - k].mean(axis=0)
    return result


def naive_krum(arrays: list[np.ndarray], f: int) -> int:
    stacked = np.stack(arrays)
    n = len(arrays)
    dist = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            dist[i, j] = dist[j, i] = float(np.linalg.norm(stacked[i] - stacked[j])) ** 2
    scores = [float(np.sort(np.delete(dist[i], i))[: n - f - 2].sum()) for i in range(n)]
    return int(np.argmin(scores))


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Best wall time of ``repeat`` calls, and the last result."""
    best, result = math.inf, None
    for _ in range(repeat):
        result = None
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_one(
    method: str, arrays: list[np.ndarray], repeat: int, threads: int | None, naive: bool
) -> dict[str, Any]:
    n, size = len(arrays), arrays[0].size
    inputs = [{"g": a} for a in arrays]
    counts = [1000 + 37 * i for i in range(n)]
    f = byzantine_for(n)
    k = max(1, n // 8)
    params = {
        "fedavg": AggregationParams("fedavg"),
        "fedavg_exact": AggregationParams("fedavg", accumulate="exact"),
        "median": AggregationParams("median"),
        "trimmed_mean": AggregationParams("trimmed_mean", trim_ratio=trim_ratio_for(n)),
        "krum": AggregationParams("krum", byzantine=f),
    }[method]

    if method == "krum":
        ours_s, (result, info) = timed(
            lambda: aggregate_with_info(inputs, params, threads=threads), repeat
        )
        ours: Any = info.selected[0] if info.selected else None
    else:
        ours_s, result = timed(lambda: aggregate(inputs, params, counts, threads=threads), repeat)
        ours = result["g"]
    del result
    gbytes = n * size * arrays[0].itemsize / 1e9
    row: dict[str, Any] = {
        "method": method,
        "inputs": n,
        "size": size,
        "input_gb": round(gbytes, 3),
        "ours_s": round(ours_s, 4),
        "ours_gbps": round(gbytes / ours_s, 3),
    }
    if method == "krum":
        row["byzantine"] = f
    if method == "trimmed_mean":
        row["trimmed_per_side"] = k
    if naive:
        naive_fn: Callable[[], Any] = {
            "fedavg": lambda: naive_fedavg(arrays, counts),
            "fedavg_exact": lambda: naive_fedavg(arrays, counts),
            "median": lambda: naive_median(arrays),
            "trimmed_mean": lambda: naive_trimmed_mean(arrays, k),
            "krum": lambda: naive_krum(arrays, f),
        }[method]
        naive_s, expected = timed(naive_fn, 1)
        row["naive_s"] = round(naive_s, 4)
        row["naive_gbps"] = round(gbytes / naive_s, 3)
        row["ratio"] = round(naive_s / ours_s, 2)
        if method == "krum":
            row["agrees"] = bool(ours == expected)
        else:  # the naive forms round through float32; gradstore rounds once from float64
            row["agrees"] = bool(np.allclose(ours, expected, rtol=1e-5, atol=1e-6))
        del expected
    target = TARGET_GBPS.get(method)
    ok = (target is None or row["ours_gbps"] >= target) and row.get(
        "ratio", math.inf
    ) >= TARGET_RATIO
    row["meets_targets"] = None if method == "fedavg_exact" else ok
    return row


def linear_kernel() -> str:
    """Which kernel fedavg runs on inputs this large: numba (with its version) or NumPy."""
    if _fused.kernel(_fused.MIN_ELEMENTS) is None:
        return f"numpy {np.__version__}"
    import numba

    return f"numba {numba.__version__}"


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'method':<13}{'n':>4}{'size':>12}{'input GB':>10}{'ours s':>10}{'ours GB/s':>11}"
        f"{'naive s':>10}{'naive GB/s':>12}{'ratio':>8}  {'agrees':<7}{'targets'}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        naive = (
            f"{r['naive_s']:>10.3f}{r['naive_gbps']:>12.3f}{r['ratio']:>7.1f}x  {r['agrees']!s:<7}"
            if "naive_s" in r
            else f"{'-':>10}{'-':>12}{'-':>8}  {'-':<7}"
        )
        verdict = {None: "-", True: "ok", False: "MISSED"}[r["meets_targets"]]
        print(
            f"{r['method']:<13}{r['inputs']:>4}{r['size']:>12,}{r['input_gb']:>10.2f}"
            f"{r['ours_s']:>10.3f}{r['ours_gbps']:>11.2f}{naive}{verdict}"
        )
    for r in rows:
        if "vs_fedavg" in r:
            print(
                f"fedavg_exact n={r['inputs']} size={r['size']:,}: "
                f"{r['vs_fedavg']:.2f}x the time of fedavg (ordered)"
            )
    print(
        f"targets: fedavg >= {TARGET_GBPS['fedavg']} GB/s, median >= {TARGET_GBPS['median']} "
        f"GB/s, ratio >= {TARGET_RATIO}x; ours = best of --repeat, naive = one run"
    )
    print(f"linear kernel (fedavg): {linear_kernel()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, nargs="+", default=[8, 32], help="input counts")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[25_000_000], help="float32 elements per input"
    )
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of ours (best kept)")
    parser.add_argument("--threads", type=int, default=None, help="gradstore worker threads")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive forms")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(SEED)
    rows: list[dict[str, Any]] = []
    for size in args.sizes:
        # one buffer per input, generated once (seeded) and shared by every input count
        arrays = [rng.standard_normal(size, dtype=np.float32) for _ in range(max(args.inputs))]
        for n in args.inputs:
            for method in args.methods:
                row = bench_one(method, arrays[:n], args.repeat, args.threads, not args.no_naive)
                ordered = [r for r in rows if r["method"] == "fedavg"]
                if method == "fedavg_exact" and ordered and ordered[-1]["inputs"] == n:
                    row["vs_fedavg"] = round(row["ours_s"] / ordered[-1]["ours_s"], 2)
                rows.append(row)
                if not args.json:
                    print(f"  done {method} n={n} size={size:,}", file=sys.stderr, flush=True)
        del arrays
    if args.json:
        json.dump(
            {"seed": SEED, "threads": args.threads, "linear_kernel": linear_kernel(), "rows": rows},
            sys.stdout,
            indent=2,
        )
        print()
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
