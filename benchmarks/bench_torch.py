#!/usr/bin/env python3
"""How fast does a PyTorch bfloat16 state_dict go into IPFS through gradstore, against safetensors?

One freshly started isolated Kubo daemon (own temporary repo, the `unixfs-v1-2025`
profile, stopped at the end) and a bfloat16 state_dict of --mib MiB (16 tensors):

  ours        gradstore.torch.to_gradient(state_dict) + GradientStore.put  (pinned)
  reference   safetensors.torch.save_file(state_dict, FILE) + `ipfs add -Q --pin=true FILE`

Each side writes fresh blocks (its own variant of the tensors: one value changed every
256 KiB, so every 1 MiB chunk differs); between repetitions everything is unpinned and
`ipfs repo gc` runs (not timed), and the sides alternate which goes first. The ratio is
ours / reference time (target <= 1.1), on the best of --repeat (default 1: one run).

    .venv/bin/python -m benchmarks torch            options: --mib 1024 --repeat 1 --json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from benchmarks._common import Clock, MiB, dump_json, kubo_binary, machine, start_daemons, table
from gradstore.node import KuboDaemon, stop_all
from gradstore.store import GradientStore
from gradstore.torch import to_gradient

TENSORS = 16


def state_dict(mib: int) -> dict[str, torch.Tensor]:
    per = mib * MiB // TENSORS // 2  # bfloat16: 2 bytes per element
    g = torch.Generator().manual_seed(0)
    return {
        f"layers.{i}.weight": torch.randn(per, generator=g).to(torch.bfloat16)
        for i in range(TENSORS)
    }


def vary(sd: dict[str, torch.Tensor], k: int) -> None:
    """Change one value every 256 KiB, differently for each k, so no block is reused."""
    for t in sd.values():
        t.view(torch.int16)[:: 128 * 1024] += 1 + k


async def ours(daemon: KuboDaemon, sd: dict[str, torch.Tensor]) -> tuple[float, str]:
    async with daemon.node() as node:
        store = GradientStore(node)
        with Clock() as clock:
            cid = await store.put(to_gradient(sd))
    return clock.seconds, str(cid)


def reference(daemon: KuboDaemon, sd: dict[str, torch.Tensor], folder: Path) -> tuple[float, str]:
    path = folder / "model.safetensors"
    with Clock() as clock:
        save_file(sd, str(path))
        out = daemon.run("add", "-Q", "--pin=true", str(path), timeout=600)
    path.unlink()
    return clock.seconds, out.stdout.decode().strip()


def clean(daemon: KuboDaemon, cids: list[str]) -> None:
    for cid in cids:
        daemon.run("pin", "rm", cid, check=False)
    daemon.run("repo", "gc", "-q", timeout=600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo", default=None)
    args = parser.parse_args(argv)

    sd = state_dict(args.mib)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    times: dict[str, list[float]] = {"ours": [], "reference": []}
    [daemon] = start_daemons(kubo_binary(args.kubo), 1)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-torch-") as tmp:
            for rep in range(args.repeat):
                order = ["ours", "reference"] if rep % 2 == 0 else ["reference", "ours"]
                cids = []
                for i, side in enumerate(order):
                    vary(sd, 2 * rep + i)
                    if side == "ours":
                        seconds, cid = asyncio.run(ours(daemon, sd))
                    else:
                        seconds, cid = reference(daemon, sd, Path(tmp))
                    times[side].append(seconds)
                    cids.append(cid)
                clean(daemon, cids)
    finally:
        stop_all([daemon])

    best = {side: min(values) for side, values in times.items()}
    rows = [
        [
            side,
            f"{best[side]:.2f}",
            f"{statistics.median(times[side]):.2f}",
            f"{nbytes / best[side] / 1e6:.0f}",
        ]
        for side in ("ours", "reference")
    ]
    ratio = best["ours"] / best["reference"]
    if args.json:
        dump_json({"machine": machine(), "bytes": nbytes, "times": times, "ratio": ratio})
    else:
        print(
            f"bfloat16 state_dict of {nbytes / MiB:.0f} MiB, {TENSORS} tensors, {args.repeat} run(s)"
        )
        print(table(["side", "best s", "median s", "MB/s"], rows))
        print(f"ratio ours/reference: {ratio:.2f} (target <= 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
