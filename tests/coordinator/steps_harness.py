"""Stepped jobs on real Kubo for the coordinator tests: peers driven by hand-built signed
announcements (``Announce(step=...)``), and a listener of the coordinator's statuses and
results on the results topic."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradstore.coordinator import Coordinator
from gradstore.errors import MessageError
from gradstore.format import Gradient
from gradstore.job import JobConfig, parse_job
from gradstore.messages import Announce, Result, SigningKey, Status, encode_message, verify_message
from gradstore.node import KuboNode, follow
from gradstore.store import GradientStore

from .harness import World, key

SEED = 191919


def stepped_job(
    *,
    head: dict[str, Any] | None = None,
    body: dict[str, Any] | None = None,
    rounds: int = 1,
    deadline_s: float = 30.0,
    schema: bool = False,
) -> tuple[JobConfig, SigningKey, list[SigningKey]]:
    """Three peers; step ``head`` (``fc.*``, median over all three), then step ``body``
    (``conv.*``, fedavg, quorum 2); ``head`` / ``body`` override either step's keys."""
    coord = key(100)
    peers = sorted((key(i) for i in range(3)), key=lambda k: k.did)
    raw: dict[str, Any] = {
        "job": "test-job",
        "coordinator": coord.did,
        "peers": [k.did for k in peers],
        "aggregation": {"method": "fedavg"},
        "rounds": {"count": rounds, "quorum": 3, "deadline_s": deadline_s},
        "steps": [
            {"name": "head", "tensors": ["fc.*"], "method": "median", **(head or {})},
            {"name": "body", "tensors": ["conv.*"], "quorum": 2, **(body or {})},
        ],
    }
    if schema:
        raw["schema"] = [
            {"name": "fc.w", "dtype": "<f4", "shape": [4, 3]},
            {"name": "fc.b", "dtype": "<f4", "shape": [3]},
            {"name": "conv.w", "dtype": "<f4", "shape": [8, 5]},
        ]
    return parse_job(raw), coord, peers


def step_gradients(n: int, round_: int) -> list[dict[str, Gradient]]:
    """Each peer's gradient cut into the two steps' documents, ``{"head": ..., "body": ...}``."""
    rng = np.random.default_rng(SEED + round_)
    out = []
    for _ in range(n):
        head = {
            "fc.w": rng.standard_normal((4, 3)).astype(np.float32),
            "fc.b": rng.standard_normal(3).astype(np.float32),
        }
        body = {"conv.w": rng.standard_normal((8, 5)).astype(np.float32)}
        out.append({"head": Gradient(head), "body": Gradient(body)})
    return out


async def run_id(coordinator: Coordinator, timeout: float = 15.0) -> str:
    """The coordinator's run id, once its journal is bound."""
    deadline = time.monotonic() + timeout
    while not coordinator.run_id:
        assert time.monotonic() < deadline, "the coordinator never started"
        await asyncio.sleep(0.05)
    return coordinator.run_id


@dataclass
class Heard:
    """Every status and result the coordinator published, as a peer heard them."""

    config: JobConfig
    messages: list[Status | Result] = field(default_factory=list)
    news: asyncio.Event = field(default_factory=asyncio.Event)

    def results(self, round_: int, step: str | None) -> list[Result]:
        return [
            m
            for m in self.messages
            if isinstance(m, Result) and m.round == round_ and m.step == step
        ]

    def statuses(self, round_: int, step: str | None) -> list[Status]:
        return [
            m
            for m in self.messages
            if isinstance(m, Status) and m.round == round_ and m.step == step
        ]

    async def until(self, found: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Wait until ``found()`` is truthy; return it."""
        async with asyncio.timeout(timeout):
            while not (got := found()):
                self.news.clear()
                await self.news.wait()
        return got

    async def result(self, round_: int, step: str | None, timeout: float = 30.0) -> Result:
        results = await self.until(lambda: self.results(round_, step), timeout)
        first: Result = results[0]
        return first

    def refusal(self, round_: int, step: str | None, peer: str) -> str | None:
        """The reason a status of ``step`` gave for refusing ``peer``, if any."""
        roster = self.config.roster
        for status in reversed(self.statuses(round_, step)):
            refused = roster.members(status.refused)
            if peer in refused:
                return status.reasons[refused.index(peer)]
        return None

    def received(self, round_: int, step: str | None, peer: str) -> bool:
        """Whether a status said it received ``peer``'s input, or a result aggregated it (a
        step that closes with every input it received says so in its result alone)."""
        roster = self.config.roster
        return any(roster.has(s.received, peer) for s in self.statuses(round_, step)) or any(
            roster.has(r.peers, peer) for r in self.results(round_, step)
        )


@contextlib.asynccontextmanager
async def listening(w: World, node: KuboNode) -> AsyncIterator[Heard]:
    """Hear the coordinator's statuses and results on ``node`` (subscribed before yielding)."""
    cfg = w.config
    heard = Heard(cfg)
    async with node.subscribe(cfg.results_topic) as sub:
        await w.coord_node.wait_for_topic_peers(cfg.results_topic, 1, timeout=15)

        async def read() -> None:
            async for msg in follow(node, sub):
                try:
                    parsed = verify_message(  # a step another coordinator owns: its owner's
                        msg.data,
                        job=cfg.job,
                        coordinator=cfg.coordinator,
                        peers=cfg.roster,
                        owners=cfg.step_owners,
                    )
                except MessageError:
                    continue
                if isinstance(parsed, Status | Result):
                    heard.messages.append(parsed)
                    heard.news.set()

        task = asyncio.create_task(read())
        try:
            yield heard
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def announce(
    w: World,
    heard: Heard,
    i: int,
    round_: int,
    step: str | None,
    gradient: Gradient,
    num_samples: int,
    run: str,
    *,
    until_received: bool = True,
) -> str:
    """Peer ``i`` stores ``gradient`` and announces it for ``step`` (signed by its key),
    again every half second until a status of the step says it is received (pubsub may
    drop a message). Returns the CID."""
    peer = w.peer_keys[i]
    cid = await GradientStore(w.peer_nodes[i]).put(gradient)
    ann = Announce(
        job=w.config.job,
        run=run,
        round=round_,
        step=step,
        peer=peer.did,
        cid=str(cid),
        num_samples=num_samples,
        sent_at=int(time.time() * 1000),
    )
    data = encode_message(ann, peer)
    deadline = time.monotonic() + 20
    while True:
        await w.peer_nodes[i].publish(w.config.gradients_topic, data)
        if not until_received or heard.received(round_, step, peer.did):
            return str(cid)
        assert time.monotonic() < deadline, f"peer {i}'s announcement of {step} was never received"
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.5):
                await heard.until(lambda: heard.received(round_, step, peer.did))
