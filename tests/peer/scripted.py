"""A scripted coordinator on real Kubo pubsub: a test key that IS the job's coordinator
publishes signed per-step statuses and results as a test says, and collects the peers'
announcements. It stands in for the coordinator's steps (issue 19) while the peer is tested.

Like the real coordinator, it repeats every status and result it has sent with a fresh
stamp every ``REPEAT_S`` (its beacon), so a peer that missed one hears it again; one-off
(hostile) messages go out once with ``send``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from gradstore.dag import CID
from gradstore.dag.cid import DAG_CBOR
from gradstore.job import JobConfig, parse_job
from gradstore.messages import Announce, Result, SigningKey, Status, encode_message, verify_message
from gradstore.node import KuboNode

from ..coordinator.harness import key

RUN: Final = "scripted00000000000000run0"
REPEAT_S: Final = 0.5

#: Tensors of the stepped job's gradients, by step (job order: head, body, embed).
STEP_TENSORS: Final = {
    "head": ("head.b", "head.w"),
    "body": ("body.b", "body.w"),
    "embed": ("embed",),
}


def stepped_job(n_peers: int = 2, **extra: Any) -> tuple[JobConfig, SigningKey, list[SigningKey]]:
    """A job of three steps, output layer first: head (``head.*``, every peer), body (two
    exact names, peer 0 only) and embed (every peer)."""
    coord = key(100)
    peers = sorted((key(i) for i in range(n_peers)), key=lambda k: k.did)
    raw = {
        "job": "steps-job",
        "coordinator": coord.did,
        "peers": [k.did for k in peers],
        "aggregation": {"method": "mean"},
        "rounds": {"count": 1, "quorum": 1, "deadline_s": 30},
        "steps": [
            {"name": "head", "tensors": ["head.*"]},
            {"name": "body", "tensors": ["body.w", "body.b"], "peers": [peers[0].did]},
            {"name": "embed", "tensors": ["embed"]},
        ],
        **extra,
    }
    return parse_job(raw), coord, peers


def record_cid(tag: str) -> CID:
    """A dag-cbor CID standing for a record (the peer does not fetch records)."""
    return CID.hash(DAG_CBOR, tag.encode())


@dataclass(frozen=True)
class Heard:
    """One announcement the coordinator received: its wire bytes and the message."""

    data: bytes
    msg: Announce


class ScriptedCoordinator:
    """The job's coordinator as a script: ``status``/``result`` publish (and keep repeating)
    signed messages; ``announcement`` waits for a peer's announcement."""

    def __init__(self, config: JobConfig, coord: SigningKey, node: KuboNode) -> None:
        self.config, self.key, self.node = config, coord, node
        self.heard: list[Heard] = []
        self._kept: dict[tuple[str, int, str | None], Status | Result] = {}
        self._news = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ScriptedCoordinator]:
        """Listen for announcements and repeat what was sent, until the block ends."""
        async with self.node.subscribe(self.config.gradients_topic) as sub:
            tasks = [asyncio.create_task(self._listen(sub)), asyncio.create_task(self._beacon())]
            try:
                yield self
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _listen(self, sub: Any) -> None:
        cfg = self.config
        async for message in sub:
            msg = verify_message(
                message.data, job=cfg.job, coordinator=cfg.coordinator, peers=cfg.roster
            )
            if isinstance(msg, Announce):
                async with self._news:
                    self.heard.append(Heard(message.data, msg))
                    self._news.notify_all()

    async def _beacon(self) -> None:
        while True:
            await asyncio.sleep(REPEAT_S)
            for msg in list(self._kept.values()):
                await self.send(replace(msg, sent_at=_now_ms()))

    async def send(self, msg: Status | Result, signer: SigningKey | None = None) -> None:
        """Publish ``msg`` once, signed by the coordinator's key (or ``signer``)."""
        await self.node.publish(self.config.results_topic, encode_message(msg, signer or self.key))

    async def status(
        self,
        round_: int,
        step: str | None,
        *,
        received: Sequence[str] = (),
        verified: Sequence[str] = (),
        refused: Mapping[str, str] | None = None,
        failed: str | None = None,
        deadline: int | None = None,
    ) -> None:
        """Publish (and keep repeating) the status of ``step`` of ``round_`` (``deadline``:
        when its deadline falls, unix ms)."""
        roster = self.config.roster
        refused = refused or {}
        order = roster.members(roster.bitmap(refused))
        msg = Status(
            self.config.job,
            RUN,
            round_,
            step=step,
            received=roster.bitmap([*received, *verified]),
            verified=roster.bitmap(verified),
            refused=roster.bitmap(refused),
            reasons=tuple(refused[p] for p in order),
            sent_at=_now_ms(),
            deadline=deadline,
            failed=failed,
        )
        self._kept[("status", round_, step)] = msg
        await self.send(msg)

    async def result(
        self, round_: int, step: str | None, cid: CID, peers: Sequence[str], record: CID
    ) -> None:
        """Publish (and keep repeating) the result of ``step`` of ``round_`` (None: the round's)."""
        msg = Result(
            self.config.job,
            RUN,
            round_,
            step=step,
            cid=str(cid),
            record=str(record),
            method="mean",
            peers=self.config.roster.bitmap(peers),
            sent_at=_now_ms(),
        )
        self._kept[("result", round_, step)] = msg
        await self.send(msg)

    async def announcement(self, match: Callable[[Announce], bool], timeout: float = 20.0) -> Heard:
        """The first announcement heard that ``match``es (waiting for it)."""

        def found() -> Heard | None:
            return next((h for h in self.heard if match(h.msg)), None)

        async with self._news:
            await asyncio.wait_for(self._news.wait_for(lambda: found() is not None), timeout)
        heard = found()
        assert heard is not None
        return heard


def bare_status(config: JobConfig, step: str | None, **fields: Any) -> Status:
    """A status of round 0 of the scripted run with empty lists and ``fields`` (one-off,
    hostile messages: send them with ``ScriptedCoordinator.send``)."""
    none = b"" if "lists" in fields else config.roster.bitmap([])
    return Status(config.job, RUN, 0, step=step, received=none, verified=none, refused=none,
                  reasons=(), sent_at=_now_ms(), **fields)  # fmt: skip


def _now_ms() -> int:
    return int(time.time() * 1000)
