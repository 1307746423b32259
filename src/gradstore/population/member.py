"""The member's side: ``PopulationMember`` reports each interval's checkpoint and score and
gets the decision; reading the signed record, and if it copies, fetching the source's
checkpoint by CID, every block verified (``GradientStore.get``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Self

from ..dag.cid import CID
from ..errors import ConfigError, MessageError, Reason
from ..format import Gradient
from ..job import JobConfig
from ..messages.keys import SigningKey
from ..node import Node, Subscription
from ..pbt.space import HValue
from ..store import GradientStore
from .controller import population_topics
from .next import NextInterval, verify_next
from .record import PopulationRecord, decode_population_record
from .report import MemberReport, encode_report


@dataclass(frozen=True)
class NextState:
    """How a member goes on: from ``checkpoint`` (None: its own) with ``hparams``."""

    checkpoint: CID | None
    source: str | None
    hparams: dict[str, HValue]


async def read_decision(node: Node, record_cid: CID, *, controller: str) -> PopulationRecord:
    """The decision record at ``record_cid``: hash, schema and ``controller``'s signature
    checked (``MessageError`` not-coordinator for a record another key signed)."""
    rec = decode_population_record(await node.get_block(record_cid), cid=record_cid)
    if rec.controller != controller:
        raise MessageError(Reason.NOT_COORDINATOR, f"record {record_cid} is {rec.controller}'s")
    return rec


def next_state(rec: PopulationRecord, member: str) -> NextState:
    """What ``rec`` tells ``member`` to do next (KeyError if it names no such member)."""
    copy = next((c for c in rec.copies if c.member == member), None)
    if copy is not None:
        return NextState(copy.checkpoint, copy.source, dict(copy.hparams))
    return NextState(None, None, rec.hparams_after()[member])


async def fetch_checkpoint(store: GradientStore, cid: CID) -> Gradient:
    """The checkpoint at ``cid``, fetched and verified block by block, then decoded."""
    return await store.get(cid)


@dataclass(frozen=True)
class MemberDecision:
    """What the controller decided for a member after an interval.

    ``interval`` is the next one to train (``done``: the job has no more). ``source`` is
    the member it copies (None: it keeps its own weights), ``checkpoint`` that member's
    checkpoint, fetched and verified block by block (None when it keeps its own).
    """

    interval: int
    record: CID
    source: str | None
    checkpoint_cid: CID | None
    checkpoint: Gradient | None
    hparams: dict[str, HValue]
    done: bool


class PopulationMember:
    """One member of a population job over a node: learn the run and its hyperparameters
    (``start``), then after each interval ``report`` its checkpoint and score and get the
    decision. Use as ``async with PopulationMember(...) as m:`` (it listens from then on)."""

    def __init__(
        self,
        config: JobConfig,
        key: SigningKey,
        node: Node,
        *,
        rebroadcast_s: float = 1.0,
        fetch_timeout_s: float = 60.0,
    ) -> None:
        if config.population is None:
            raise ConfigError(f"job {config.job} has no [population] section")
        if key.did not in config.population.members:
            raise ConfigError(f"{key.did} is not a member of job {config.job}'s population")
        self.config = config
        self.pop = config.population
        self.key = key
        self.node = node
        self.store = GradientStore(node, limits=config.limits)
        self.rebroadcast_s = rebroadcast_s
        self.fetch_timeout_s = fetch_timeout_s
        self.run: str | None = None
        self.interval = 0
        self.hparams: dict[str, HValue] = self.pop.first_hparams()[key.did]
        #: A late joiner's decision from ``start`` (its copied checkpoint to load), else None.
        self.pending: MemberDecision | None = None
        #: Next-interval messages refused on the way (a forger's, another job's), as texts.
        self.refused: list[str] = []
        self._topics = population_topics(config.job)
        self._sub: Subscription | None = None

    async def __aenter__(self) -> Self:
        self._sub = await self.node.subscribe(self._topics[1]).__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._sub is not None:
            await self._sub.aclose()
            self._sub = None

    async def _next(self, after: int, timeout: float | None) -> NextInterval:
        """The first signed next-interval message past interval ``after`` (-1: any) of this
        member's run (any run before ``start``)."""
        if self._sub is None:
            raise RuntimeError("use the member as `async with PopulationMember(...)`")
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while True:
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                raise TimeoutError(f"no decision for interval {after} of job {self.config.job}")
            msg = await self._sub.get(timeout=left)
            try:
                nxt = verify_next(msg.data, job=self.config.job, controller=self.config.coordinator)
            except MessageError as exc:
                self.refused.append(str(exc))
                continue
            if (self.run is None or nxt.run == self.run) and nxt.interval > after:
                return nxt

    async def start(self, *, timeout: float | None = None) -> dict[str, HValue]:
        """Wait for the controller's word on the run; return the hyperparameters to train the
        current interval (``self.interval``) with. A member that joins late takes the newest
        decision's, and the copied checkpoint is then ``self.pending``'s to load."""
        nxt = await self._next(-1, timeout)
        self.run = nxt.run
        if nxt.record is not None:
            self.pending = await self._adopt(nxt)
        return dict(self.hparams)

    async def _adopt(self, nxt: NextInterval) -> MemberDecision:
        assert nxt.record is not None
        rec = await read_decision(self.node, nxt.record, controller=self.config.coordinator)
        state = next_state(rec, self.key.did)
        got = None
        if state.checkpoint is not None:
            got = await asyncio.wait_for(
                fetch_checkpoint(self.store, state.checkpoint), self.fetch_timeout_s
            )
        self.interval, self.hparams = nxt.interval, dict(state.hparams)
        return MemberDecision(
            interval=nxt.interval,
            record=nxt.record,
            source=state.source,
            checkpoint_cid=state.checkpoint,
            checkpoint=got,
            hparams=dict(state.hparams),
            done=nxt.interval >= self.pop.intervals,
        )

    async def report(
        self, interval: int, checkpoint: Gradient, score: float, *, timeout: float | None = None
    ) -> MemberDecision:
        """Store ``checkpoint`` (pinned), sign and publish the report of ``interval`` (sent
        again every ``rebroadcast_s`` until the decision comes) and return the decision; a
        copied checkpoint comes fetched and verified block by block."""
        if self.run is None:
            raise RuntimeError("call start() first: the member does not know the run yet")
        if interval != self.interval:
            raise ValueError(f"this member trains interval {self.interval}, not {interval}")
        cid = await self.store.put(checkpoint)
        rep = MemberReport(
            self.config.job,
            self.run,
            interval,
            self.key.did,
            cid,
            float(score),
            dict(self.hparams),
            int(time.time() * 1000),
        )
        data = encode_report(rep, self.key)

        async def send() -> None:
            while True:
                await self.node.publish(self._topics[0], data)
                await asyncio.sleep(self.rebroadcast_s)

        sender = asyncio.create_task(send())
        try:
            nxt = await self._next(interval, timeout)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        return await self._adopt(nxt)
