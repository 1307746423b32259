#!/usr/bin/env python3
"""Does streaming a stepped round out of backward beat a whole-gradient sync, on real Kubo?

An MLP of --layers Linear(--width, --width) layers (float32, >= 100 MB by default: 8 x
1792^2) trained data-parallel by --peers peers, each its own process (torch with
--threads threads), over one freshly started Kubo daemon that the peers and the
coordinators share (as `benchmarks torch` and the PyTorch tests do); one process runs the
jobs' real coordinators (fedavg, quorum every peer). Every round each peer takes a fresh
batch of --batch samples, runs forward, waits for the other peers at a barrier, then
times from the start of backward until it holds the applied aggregate in .grad:

  whole     a job without steps: backward, then TorchPeer.sync_grads (one document each)
  stepped   the same steps, all handed out once backward is over
            (`loss.backward()`, then `with peer.streaming(...): pass`): pipelined steps,
            each applied as it arrives, but nothing overlaps backward
  streamed  the same steps: `with peer.streaming(...): loss.backward()`, each step put and
            announced as autograd finishes it, each aggregate applied as it arrives

The sides take turns within a round (their order alternating round by round), and each
peer then waits, untimed, for the round's own result (a stepped round's model-level output
and round/5 record, which the coordinator stores after the last step closed), so every
timed round starts with an idle coordinator; --warmup rounds come first, not counted. A
round's figure is its slowest peer's; the table gives medians over --rounds rounds
(backward alone; until the first step's aggregate is in .grad; until all of it is) and the
best, and MB/s of model per median second. ratio = streamed / whole (target <= 0.75).

Core-seconds per side (medians over the counted rounds), the figure the machine's other
load moves least: the peers' processes (summed: backward, converting, storing, announcing,
fetching and applying), the coordinators' process and the Kubo daemon, over the timed
window (from the start of backward to the applied aggregate, as the first peer sees it)
and over the whole round (until the round's own result, its model-level output included).

With --link-mbit N, the peers are on machines of their own as far as the network goes: each
peer has its own Kubo daemon on its own loopback address, swarm-connected to the
coordinators' daemon, and every byte between them (the coordinator fetching a peer's
step, a peer fetching an aggregate, the messages) crosses a link of N Mbit/s each way per
peer (`tc` on loopback, root needed). The CPU is still this machine's two cores.

    .venv/bin/python -m benchmarks steps_stream
    .venv/bin/python -m benchmarks steps_stream --link-mbit 1000
    options: --peers 2 --layers 8 --width 1792 --batch 2048 --rounds 5 --warmup 1 --json
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks._common import dump_json, kubo_binary, machine, start_daemons, table
from benchmarks._link import shaped_link
from gradstore.coordinator import Coordinator
from gradstore.job import JobConfig, parse_job
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, stop_all
from gradstore.torch import TorchPeer, steps_from_module

SIDES = ("whole", "stepped", "streamed")
#: CPU seconds per round, in a result row's order after the times.
CPU_KEYS = (
    "peers_cpu_s", "kubo_cpu_s", "coordinators_cpu_s",
    "peers_round_cpu_s", "kubo_round_cpu_s", "coordinators_round_cpu_s",
)  # fmt: skip
SEED = 20251019


def mlp(layers: int, width: int) -> nn.Sequential:
    """``layers`` x (Linear(width, width), ReLU), the same weights in every process."""
    torch.manual_seed(SEED)
    parts: list[nn.Module] = []
    for _ in range(layers):
        parts += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*parts)


def jobs(args: argparse.Namespace, coord: str, peers: list[str]) -> dict[str, dict[str, Any]]:
    """Each side's job as a raw table (the whole side's without steps)."""
    steps = steps_from_module(mlp(args.layers, 1))  # the names only: any width will do
    out = {}
    for side in args.sides:
        raw: dict[str, Any] = {
            "job": f"bench-steps-stream-{side}-{os.getpid()}",
            "coordinator": coord,
            "peers": peers,
            "aggregation": {"method": "fedavg"},
            "rounds": {"count": args.warmup + args.rounds, "quorum": len(peers)},
            "limits": {"max_gradient_bytes": 2 << 30},
        }
        raw["rounds"]["deadline_s"] = 600.0
        if side != "whole":
            raw["steps"] = steps
        out[side] = raw
    return out


# --- one peer, in its own process ------------------------------------------------------------


def peer_main(
    index: int, seed: bytes, raws: dict[str, dict[str, Any]], api: str, args: dict[str, Any],
    barrier: Any, results: Any,
) -> None:  # fmt: skip
    """Play every round of every side; put (side, round, peer, backward s, first step
    applied s, total s, then CPU seconds: this peer's, the Kubo daemons' and the
    coordinators' process's over the timed window and over the whole round; the first peer
    only measures the last two, the others give None) on ``results``."""
    torch.set_num_threads(args["threads"])
    key = SigningKey.from_seed(seed)
    model = mlp(args["layers"], args["width"])
    sides = list(raws)
    rounds = args["warmup"] + args["rounds"]
    peers = {
        side: TorchPeer(parse_job(raw), key, api=api, timeout=600) for side, raw in raws.items()
    }
    try:
        for peer in peers.values():
            peer.open()
        for round_ in range(rounds):
            order = sides if round_ % 2 == 0 else sides[::-1]
            for k, side in enumerate(order):
                g = torch.Generator().manual_seed(SEED + 1000 * round_ + 10 * k + index)
                x = torch.randn(args["batch"], args["width"], generator=g)
                model.zero_grad(set_to_none=True)
                loss = model(x).square().mean()
                barrier.wait()
                before = cpu_now(index, args["pids"])
                times = one_round(peers[side], side, model, loss, round_, len(x))
                timed = cpu_now(index, args["pids"])
                peers[side].await_result(round_)  # untimed: the coordinator is idle again
                after = cpu_now(index, args["pids"])
                cpu = [_delta(before[k], timed[k]) for k in range(3)]
                cpu += [_delta(before[k], after[k]) for k in range(3)]
                results.put((side, round_, index, *times, *cpu))
    except BaseException as exc:
        results.put(("error", index, repr(exc)))
        barrier.abort()
        raise
    finally:
        for peer in peers.values():
            peer.close()


def cpu_now(index: int, pids: tuple[list[int], int]) -> tuple[float, float | None, float | None]:
    """CPU seconds so far: this process's (every thread), and for the first peer also the
    Kubo daemons' (summed) and the coordinators' process's (``pids``)."""
    own = time.process_time()
    if index != 0:
        return own, None, None
    return own, sum(process_cpu_s(pid) for pid in pids[0]), process_cpu_s(pids[1])


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def one_round(
    peer: TorchPeer, side: str, model: nn.Module, loss: torch.Tensor, round_: int, n: int
) -> tuple[float, float, float]:
    """Seconds from the start of backward to its end, to the first step's aggregate in
    ``.grad``, and to the whole aggregate in ``.grad``."""
    start = time.perf_counter()
    if side == "whole":
        loss.backward()  # type: ignore[no-untyped-call]
        backward = time.perf_counter() - start
        peer.sync_grads(model, round_, n)
        total = time.perf_counter() - start
        return backward, total, total
    if side == "streamed":
        with peer.streaming(model, round_, n) as s:
            loss.backward()  # type: ignore[no-untyped-call]
            backward = time.perf_counter() - start
    else:  # stepped: the same steps, all handed out once backward is over
        loss.backward()  # type: ignore[no-untyped-call]
        backward = time.perf_counter() - start
        with peer.streaming(model, round_, n) as s:
            pass
    total = time.perf_counter() - start
    assert len(s.results) == len(peer.config.steps)
    offset = time.monotonic() - time.perf_counter()  # the round's times are monotonic ones
    return backward, min(s.applied_at.values()) - offset - start, total


# --- the coordinators, in this process -------------------------------------------------------


@contextmanager
def coordinators(
    daemon: KuboDaemon, configs: list[JobConfig], key: SigningKey, state: Path, budget: int
) -> Iterator[None]:
    """Every job's Coordinator on one event loop in a thread, until its rounds are done."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failed: list[BaseException] = []

    async def main() -> None:
        async with daemon.node() as node:
            runs = [
                Coordinator(config, key, node, state / config.job, memory_budget_bytes=budget,
                            rebroadcast_s=1.0, linger_s=0).run(stop)
                for config in configs
            ]  # fmt: skip
            await asyncio.gather(*runs)

    def target() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=target, name="coordinators", daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(120)
    if failed:
        raise failed[0]


# --- the run ---------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    coord = SigningKey.generate()
    seeds = [os.urandom(32) for _ in range(args.peers)]
    keys = [SigningKey.from_seed(seed) for seed in seeds]
    raws = jobs(args, coord.did, [k.did for k in keys])
    configs = [parse_job(raw) for raw in raws.values()]
    nbytes = sum(p.numel() * p.element_size() for p in mlp(args.layers, args.width).parameters())
    budget = (args.peers + 2) * nbytes
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(args.peers)
    results = ctx.Queue()
    peer_args: dict[str, Any] = {k: getattr(args, k) for k in ("layers", "width", "batch", "rounds", "warmup", "threads")}  # fmt: skip
    daemons = start_nodes(args)
    daemon = daemons[0]
    apis = [d.api_url for d in daemons[1:]] or [daemon.api_url] * args.peers
    peer_args["pids"] = ([d.pid for d in daemons], os.getpid())
    rows: list[tuple[Any, ...]] = []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-steps-stream-") as tmp,
            shaped_link([peer_address(i) for i in range(args.peers)], args.link_mbit)
            if args.link_mbit
            else nullcontext(),
            coordinators(daemon, configs, coord, Path(tmp), budget),
        ):
            procs = [
                ctx.Process(target=peer_main, args=(i, seeds[i], raws, apis[i],
                                                    peer_args, barrier, results))
                for i in range(args.peers)
            ]  # fmt: skip
            for p in procs:
                p.start()
            want = args.peers * len(raws) * (args.warmup + args.rounds)
            while len(rows) < want:
                row = results.get(timeout=1800)
                if row[0] == "error":
                    raise SystemExit(f"peer {row[1]} failed: {row[2]}")
                rows.append(row)
            for p in procs:
                p.join(120)
    finally:
        stop_all(daemons)
    return summarize(args, rows, nbytes)


def peer_address(i: int) -> str:
    """Peer ``i``'s own loopback address when the link is shaped."""
    return f"127.0.0.{11 + i}"


def start_nodes(args: argparse.Namespace) -> list[KuboDaemon]:
    """One Kubo daemon for all, or (--link-mbit) the coordinators' and one per peer, each
    peer's on its own loopback address, dialled by the coordinators' daemon."""
    binary = kubo_binary(args.kubo)
    daemons = start_daemons(binary, 1)
    if not args.link_mbit:
        return daemons
    try:
        for i in range(args.peers):
            swarm = [f"/ip4/{peer_address(i)}/tcp/0"]
            daemons.append(KuboDaemon(binary, config={"Addresses.Swarm": swarm}).start())
            addr = next(
                a for a in daemons[-1].swarm_addrs if a.startswith(f"/ip4/{peer_address(i)}/tcp/")
            )
            daemons[0].run("swarm", "connect", f"{addr}/p2p/{daemons[-1].peer_id}")
    except BaseException:
        stop_all(daemons)
        raise
    return daemons


def summarize(args: argparse.Namespace, rows: list[tuple[Any, ...]], nbytes: int) -> dict[str, Any]:
    """Per side: each counted round's slowest peer (backward, first applied, total), and its
    core-seconds (the peers' summed, Kubo's, the coordinators'; timed window, whole round)."""
    out: dict[str, Any] = {"machine": machine(), "bytes": nbytes, "args": vars(args), "sides": {}}
    for side in args.sides:
        got: dict[str, list[float]] = {"backward_s": [], "first_applied_s": [], "totals_s": []}
        for key in CPU_KEYS:
            got[key] = []
        for round_ in range(args.warmup, args.warmup + args.rounds):
            mine = [r for r in rows if r[0] == side and r[1] == round_]
            for k, key in enumerate(("backward_s", "first_applied_s", "totals_s")):
                got[key].append(max(r[3 + k] for r in mine))
            first = next(r for r in mine if r[2] == 0)
            for k, key in enumerate(CPU_KEYS):
                if key.startswith("peers"):
                    got[key].append(sum(r[6 + k] for r in mine))
                else:
                    got[key].append(first[6 + k])
        out["sides"][side] = got
    if "whole" in args.sides and "streamed" in args.sides:
        sides = out["sides"]
        out["ratio"] = statistics.median(sides["streamed"]["totals_s"]) / statistics.median(
            sides["whole"]["totals_s"]
        )
    return out


def report(data: dict[str, Any], args: argparse.Namespace) -> str:
    rows = []
    for side, d in data["sides"].items():
        median = statistics.median(d["totals_s"])
        rows.append([side, f"{statistics.median(d['backward_s']):.2f}",
                     f"{statistics.median(d['first_applied_s']):.2f}", f"{median:.2f}",
                     f"{min(d['totals_s']):.2f}", f"{data['bytes'] / median / 1e6:.0f}"])  # fmt: skip
    head = (
        f"{args.peers} peers x MLP {args.layers} x Linear({args.width}, {args.width}) = "
        f"{data['bytes'] / 1e6:.1f} MB float32 ({args.layers} steps), batch {args.batch}, "
        f"{args.threads} torch thread(s) per peer, {args.rounds} rounds (+{args.warmup} warm-up), "
        f"{nodes(args)}, load {data['machine']['loadavg']}"
    )
    headers = ["side", "backward s", "1st applied s", "all applied s", "best s", "MB/s"]
    cpu_rows = []
    for side, d in data["sides"].items():
        med = {k: statistics.median(d[k]) for k in CPU_KEYS}
        window = [med["peers_cpu_s"], med["coordinators_cpu_s"], med["kubo_cpu_s"]]
        whole = [med["peers_round_cpu_s"], med["coordinators_round_cpu_s"], med["kubo_round_cpu_s"]]
        cpu_rows.append([side, *(f"{v:.2f}" for v in window), f"{sum(window):.2f}",
                         *(f"{v:.2f}" for v in whole), f"{sum(whole):.2f}"])  # fmt: skip
    cpu_headers = ["core-s", "peers", "coordinators", "Kubo", "all", "round: peers",
                   "coordinators", "Kubo", "all"]  # fmt: skip
    lines = [head, table(headers, rows), "", table(cpu_headers, cpu_rows)]
    if "ratio" in data:
        lines.append(f"ratio streamed/whole: {data['ratio']:.2f} (target <= 0.75)")
    return "\n".join(lines)


def nodes(args: argparse.Namespace) -> str:
    if not args.link_mbit:
        return "one Kubo daemon"
    return f"a Kubo daemon per peer on a {args.link_mbit} Mbit/s link + the coordinators'"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=2, help="2-4 (default 2)")
    parser.add_argument("--layers", type=int, default=8, help="Linear layers = steps (default 8)")
    parser.add_argument("--width", type=int, default=1792)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds per side")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per peer (default: cores / peers, at least 1)")  # fmt: skip
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--link-mbit", type=int, default=0,
                        help="a Kubo daemon per peer on a link of this rate (Mbit/s each way, "
                             "tc, root); default: one daemon for all, loopback")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubo", default=None)
    args = parser.parse_args(argv)
    if args.threads is None:
        args.threads = max(1, (os.cpu_count() or 1) // args.peers)
    data = run(args)
    if args.json:
        dump_json(data)
    else:
        print(report(data, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
