"""A job on real Kubo daemons for the coordinator tests: one coordinator node, peers on two others."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradstore.coordinator import Coordinator, TreeRoot
from gradstore.errors import RefusedError
from gradstore.format import Gradient
from gradstore.job import JobConfig, parse_job
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, KuboNode
from gradstore.peer import Peer

SEED = 424242


def key(i: int) -> SigningKey:
    return SigningKey.from_seed(bytes([i + 1]) * 32)


def make_job(
    n_peers: int = 4,
    *,
    method: str = "fedavg",
    rounds: int = 1,
    quorum: int | None = None,
    deadline_s: float = 30.0,
    **aggregation: Any,
) -> tuple[JobConfig, SigningKey, list[SigningKey]]:
    coord = key(100)
    peers = sorted((key(i) for i in range(n_peers)), key=lambda k: k.did)
    raw = {
        "job": "test-job",
        "coordinator": coord.did,
        "peers": [k.did for k in peers],
        "aggregation": {"method": method, **aggregation},
        "rounds": {"count": rounds, "quorum": quorum or n_peers, "deadline_s": deadline_s},
    }
    return parse_job(raw), coord, peers


def gradients(n: int, round_: int, shape: tuple[int, ...] = (64, 33)) -> list[Gradient]:
    rng = np.random.default_rng(SEED + round_)
    return [
        Gradient({"w": rng.standard_normal(shape).astype(np.float32), "b": rng.standard_normal(7)})
        for _ in range(n)
    ]


@dataclass
class World:
    config: JobConfig
    coord_key: SigningKey
    peer_keys: list[SigningKey]
    coord_node: KuboNode
    peer_nodes: list[KuboNode]  # one per peer key (peers share two daemons)


@contextlib.asynccontextmanager
async def world(
    daemons: Sequence[KuboDaemon], config: JobConfig, coord: SigningKey, peers: list[SigningKey]
) -> AsyncIterator[World]:
    coord_node = daemons[0].node()
    carriers = [d.node() for d in daemons[1:]]
    try:
        yield World(
            config,
            coord,
            peers,
            coord_node,
            [carriers[i % len(carriers)] for i in range(len(peers))],
        )
    finally:
        for n in (coord_node, *carriers):
            await n.aclose()


async def wait_subscribed(w: World) -> None:
    """Pubsub delivers only to peers the publisher already knows: wait for both directions."""
    for node in {id(n): n for n in w.peer_nodes}.values():
        await node.wait_for_topic_peers(w.config.gradients_topic, 1, timeout=15)


def start_coordinator(
    w: World, state: Path, **kwargs: Any
) -> tuple[Coordinator, asyncio.Task[Any]]:
    coordinator = Coordinator(
        w.config, w.coord_key, w.coord_node, state, rebroadcast_s=0.5, linger_s=0, **kwargs
    )
    return coordinator, asyncio.create_task(coordinator.run())


async def publish_all(
    w: World,
    round_: int,
    grads: Sequence[Gradient | None],
    samples: Sequence[int],
    *,
    refused: Sequence[int] = (),
) -> dict[int, str]:
    """Every peer with a gradient publishes it; the peers in ``refused`` must be refused.

    Returns the coordinator's reason for each refused peer (what `peer publish` prints).
    """

    async def one(i: int) -> str | None:
        g = grads[i]
        if g is None:
            return None
        async with Peer(w.config, w.peer_nodes[i], w.peer_keys[i], first_backoff_s=0.3) as peer:
            try:
                await peer.publish(g, round_, samples[i], timeout=30)
            except RefusedError as exc:
                if i not in refused:
                    raise
                return exc.reason
            assert i not in refused, f"peer {i} was not refused"
            return None

    reasons = await asyncio.gather(*(one(i) for i in range(len(w.peer_keys))))
    return {i: r for i, r in enumerate(reasons) if r is not None}


def write_job_toml(config: JobConfig, path: Path) -> Path:
    """The job file a user would write for ``config`` (aggregation method, rounds, quorum, deadline)."""
    peers = ", ".join(f'"{p}"' for p in config.peers)
    r = config.rounds
    path.write_text(
        f'job = "{config.job}"\ncoordinator = "{config.coordinator}"\npeers = [{peers}]\n'
        f'[aggregation]\nmethod = "{config.method}"\n'
        f"[rounds]\ncount = {r.count}\nquorum = {r.quorum}\ndeadline_s = {r.deadline_s}\n"
    )
    return path


def job_toml(raw: dict[str, Any], path: Path) -> Path:
    """``raw`` (a job as ``parse_job`` reads it: job, coordinator, peers, the aggregation and
    rounds tables, and its groups or steps) as the job file a user writes."""

    def value(v: Any) -> str:
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = [f"{k} = {value(raw[k])}" for k in ("job", "coordinator", "peers")]
    for table in ("aggregation", "rounds"):
        lines.append(f"[{table}]")
        lines += [f"{k} = {value(v)}" for k, v in raw[table].items()]
    for array in ("groups", "steps"):
        for entry in raw.get(array, ()):
            lines.append(f"[[{array}]]")
            lines += [f"{k} = {value(v)}" for k, v in entry.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.asynccontextmanager
async def running(c: Coordinator | TreeRoot) -> AsyncIterator[asyncio.Task[Any]]:
    """``c`` running until the block ends (then stopped and awaited)."""
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)  # a coordinator that crashed fails the test


def coordinator_process(job: Path, keyfile: Path, api: str, state: Path) -> subprocess.Popen[bytes]:
    """``gradstore coordinator`` for ``keyfile``'s key, in a process of its own (to SIGKILL);
    its output in ``state``.out and .err."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "gradstore", "coordinator", "--config", str(job)]
    cmd += ["--key", str(keyfile), "--api", api, "--state", str(state), "-v"]
    with open(state.with_suffix(".out"), "wb") as out, open(state.with_suffix(".err"), "wb") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
