"""Peer side of a job (DESIGN section 5).

Pubsub has no delivery guarantee, so a peer re-announces with backoff until a
status or result from the coordinator shows its CID, and keeps every result it
sees so ``await_result`` also answers for a round that closed a moment ago.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dag import CID
from ..errors import CoordinatorError, MessageError, RoundFailedError
from ..format import Gradient
from ..job import JobConfig
from ..messages import Announce, Result, SigningKey, Status, encode_message, verify_message
from ..node import Node, follow
from ..store import GradientStore

log = logging.getLogger("gradstore.peer")


@dataclass(frozen=True)
class AggregateResult:
    """A round's verified result: the coordinator's signed message and the fetched aggregate."""

    round: int
    cid: CID
    record: CID
    peers: tuple[str, ...]
    gradient: Gradient


class Peer:
    """One peer of a job, over one node. Use as ``async with Peer(...) as peer``.

    Without a key it can only await results (they are checked against the job's coordinator).
    """

    def __init__(
        self,
        config: JobConfig,
        node: Node,
        key: SigningKey | None = None,
        *,
        first_backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
    ) -> None:
        if key is not None and key.did not in config.peers:
            raise CoordinatorError(f"{key.did} is not among the job's peers")
        self.config = config
        self.key = key
        self.node = node
        self.store = GradientStore(node, limits=config.limits)
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.announcements_sent = 0
        self._results: dict[int, Result] = {}
        self._failed: dict[int, str] = {}  # round -> the coordinator's reason
        self._acked: dict[int, set[str]] = {}
        self._news = asyncio.Condition()
        self._sub: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Peer:
        self._sub = self.node.subscribe(self.config.results_topic)
        await self._sub.__aenter__()
        self._reader = asyncio.create_task(self._read(), name="peer-results-reader")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._sub is not None:
            await self._sub.__aexit__(None, None, None)

    async def _read(self) -> None:
        cfg = self.config
        async for msg in follow(self.node, self._sub):
            try:
                parsed = verify_message(
                    msg.data, job=cfg.job, coordinator=cfg.coordinator, peers=cfg.peers
                )
            except MessageError as exc:
                log.warning("ignored a message on %s: %s", cfg.results_topic, exc)
                continue
            async with self._news:
                if isinstance(parsed, Result):
                    self._results.setdefault(parsed.round, parsed)
                elif isinstance(parsed, Status):
                    self._acked.setdefault(parsed.round, set()).update(parsed.received)
                    if parsed.failed is not None:
                        self._failed.setdefault(parsed.round, parsed.failed)
                self._news.notify_all()

    def _acknowledged(self, round_: int) -> bool:
        assert self.key is not None
        return (
            self.key.did in self._acked.get(round_, set())
            or (round_ in self._results and self.key.did in self._results[round_].peers)
            or any(r > round_ for r in self._results)
        )

    async def publish(
        self,
        gradient: Gradient,
        round_: int,
        num_samples: int,
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> CID:
        """Store ``gradient`` (pinned on our node), announce it, and re-announce until acknowledged."""
        if self._reader is None:
            raise CoordinatorError("use the Peer as `async with Peer(...) as peer`")
        if self.key is None:
            raise CoordinatorError("publishing needs the peer's key")
        key = self.key
        meta = dict(gradient.meta)
        meta.update(
            {
                "kind": meta.get("kind", "gradient"),
                "round": round_,
                "peer": key.did,
                "num_samples": num_samples,
                "job": self.config.job,
            }
        )
        cid = await self.store.put(Gradient(gradient.tensors, meta))
        announce = Announce(
            job=self.config.job,
            round=round_,
            peer=key.did,
            cid=str(cid),
            num_samples=num_samples,
            sent_at=0,
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = self.first_backoff_s
        while True:
            data = encode_message(_with_time(announce), key)
            await self.node.publish(self.config.gradients_topic, data)
            self.announcements_sent += 1
            if not wait:
                return cid
            acked = await self._wait_for(lambda: self._acknowledged(round_), delay, deadline)
            if acked:
                return cid
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"round {round_}: the coordinator did not acknowledge {cid} in {timeout}s"
                )
            delay = min(delay * 2, self.max_backoff_s)

    async def await_result(self, round_: int, *, timeout: float | None = None) -> AggregateResult:
        """Wait for the round's signed result, then fetch and verify the aggregate.

        Raises ``RoundFailedError`` as soon as the coordinator's status says the round failed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = await self._wait_for(
            lambda: round_ in self._results or round_ in self._failed, None, deadline
        )
        if not ok:
            raise TimeoutError(
                f"no result for round {round_} of job {self.config.job} within {timeout}s"
            )
        if round_ not in self._results:
            raise RoundFailedError(self.config.job, round_, self._failed[round_])
        result = self._results[round_]
        gradient = await self.store.get(result.cid)
        return AggregateResult(
            round_, CID.parse(result.cid), CID.parse(result.record), result.peers, gradient
        )

    async def _wait_for(self, ready: Any, step: float | None, deadline: float | None) -> bool:
        """Wait until ``ready()`` or ``step`` seconds pass or the deadline; True when ready."""
        async with self._news:
            limit = step
            if deadline is not None:
                left = deadline - time.monotonic()
                limit = left if limit is None else min(limit, left)
            try:
                await asyncio.wait_for(self._news.wait_for(ready), limit)
            except TimeoutError:
                return bool(ready())
            return True


def _with_time(announce: Announce) -> Announce:
    return dataclasses.replace(announce, sent_at=int(time.time() * 1000))


def apply(
    params: Mapping[str, np.ndarray], aggregate: Gradient, lr: float
) -> dict[str, np.ndarray]:
    """A plain SGD step: ``params - lr * aggregate`` for every tensor (names and shapes must match)."""
    missing = set(params) ^ set(aggregate.tensors)
    if missing:
        raise ValueError(f"parameters and aggregate differ in tensors: {sorted(missing)}")
    out: dict[str, np.ndarray] = {}
    for name, value in params.items():
        grad = aggregate.tensors[name]
        if grad.shape != value.shape:
            raise ValueError(
                f"tensor {name!r}: parameter shape {value.shape} != aggregate shape {grad.shape}"
            )
        step = np.asarray(value, dtype=np.float64) - lr * np.asarray(grad, dtype=np.float64)
        out[name] = step.astype(value.dtype)
    return out
