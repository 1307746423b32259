"""One replica of one stage over a node (``StageReplica``): a round's micro-batches in, their
activations out to the next stage as documents announced by signed messages, activation
gradients back the same way (GPipe-style fill and drain, ``in_flight`` micro-batches on the
way at once), then the stage's parameter gradients published as its step and the step's
aggregate applied. A micro-batch that does not arrive by the pipeline's deadline fails the
replica's round with a reason (``MicroBatchMissing``): the round never hangs on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Self

import numpy as np

from ..dag.cid import CID
from ..errors import ConfigError, GradstoreError, MessageError, Reason, reason_text
from ..format import Gradient
from ..job import JobConfig, PipelineConfig
from ..messages.keys import SigningKey
from ..node import Node, Subscription
from ..peer import Peer, apply
from ..store import GradientStore
from .layers import Array, DenseStage, Params
from .message import (
    BACKWARD,
    FORWARD,
    Direction,
    StageMessage,
    encode_stage_message,
    pipeline_topic,
    verify_stage_message,
)

#: The tensor name of an activation (or activation-gradient) document.
ACTIVATION: str = "activation"
#: The ``kind`` of the first stage's input rows and of a stage's parameters, as documents.
STAGE_INPUT: str = "stage-input"
STAGE_PARAMS: str = "stage-params"
#: The longest a sent message waits before it is sent again (its wait doubles from
#: ``rebroadcast_s`` up to this).
MAX_RESEND_GAP_S: float = 4.0


@dataclass
class _Sent:
    """A sent message, sent again at ``due`` (monotonic) unless answered first."""

    data: bytes
    due: float
    gap: float


#: Sent messages by (direction, micro-batch).
_Outbox = dict[tuple[str, int], _Sent]


class PipelineError(GradstoreError):
    """A replica's round of the pipeline failed: ``reason`` is a reason text (``code: ...``)."""

    def __init__(self, code: Reason, detail: str) -> None:
        self.code = code
        self.reason = reason_text(code, detail)
        super().__init__(self.reason)


class MicroBatchMissing(PipelineError):
    """Micro-batches whose activations (or gradients) did not arrive by the deadline."""


@dataclass
class ReplicaRound:
    """What one replica's round did: the stage's summed parameter gradients, the loss (last
    stage: of its lane's rows), the activation CIDs it took in and sent out per micro-batch
    (what ``audit`` re-executes), seconds spent waiting on its neighbours (bubble) and
    computing (of which ``put_s`` putting documents and announcing them, ``fetch_s``
    fetching them), the messages it sent again, and those it refused on the way."""

    grads: Params
    loss: float | None = None
    params: CID | None = None  # the stage's parameters this round, as a document
    inputs: dict[int, CID] = field(default_factory=dict)
    outputs: dict[int, CID] = field(default_factory=dict)
    bubble_s: float = 0.0
    busy_s: float = 0.0
    put_s: float = 0.0
    fetch_s: float = 0.0
    wall_s: float = 0.0
    resent: int = 0
    refused: list[str] = field(default_factory=list)


class StageReplica:
    """Replica ``r`` of one stage of a pipeline job, over ``node``, with ``peer`` (the same
    key's ``Peer``, entered) to publish its step. Use as ``async with StageReplica(...)``."""

    def __init__(
        self,
        config: JobConfig,
        key: SigningKey,
        node: Node,
        peer: Peer,
        layer: DenseStage,
        *,
        rebroadcast_s: float = 0.5,
    ) -> None:
        if config.pipeline is None:
            raise ConfigError(f"job {config.job} has no [[stages]]")
        place = config.pipeline.place(key.did)
        if place is None:
            raise ConfigError(f"{key.did} holds no stage of job {config.job}")
        self.config = config
        self.pipe: PipelineConfig = config.pipeline
        self.stage_index, self.replica = place
        self.stage = self.pipe.stages[self.stage_index].name
        self.key = key
        self.node = node
        self.peer = peer
        self.layer = layer
        self.store = GradientStore(node, limits=config.limits)
        self.rebroadcast_s = rebroadcast_s
        self._sub: Subscription | None = None

    @property
    def first(self) -> bool:
        return self.stage_index == 0

    @property
    def last(self) -> bool:
        return self.stage_index == len(self.pipe.stages) - 1

    async def __aenter__(self) -> Self:
        self._sub = await self.node.subscribe(pipeline_topic(self.config.job)).__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._sub is not None:
            await self._sub.aclose()
            self._sub = None

    async def run_id(self, timeout: float) -> str:
        """The coordinator's run, once the peer has heard it."""
        end = time.monotonic() + timeout
        while self.peer.run is None:
            if time.monotonic() > end:
                raise PipelineError(Reason.ABSENT, f"no word from the coordinator in {timeout}s")
            await asyncio.sleep(0.05)
        return self.peer.run

    async def train_round(
        self,
        round_: int,
        params: Params,
        *,
        x: Sequence[Array] | None = None,
        y: Sequence[Array] | None = None,
        rows: int,
        lr: float,
    ) -> tuple[Params, ReplicaRound]:
        """Run micro-batches through this stage (``x``: the first stage's inputs, ``y``: the
        last stage's labels, one array per micro-batch; ``rows`` the lane's rows this
        round), publish the stage's gradients as its step, apply the step's aggregate and
        return the new parameters. A message is sent again after ``rebroadcast_s``, then
        after twice that (up to ``MAX_RESEND_GAP_S``), until it is answered (an activation
        by its gradient) or the round's result is out."""
        run = await self.run_id(self.pipe.deadline_s)
        sent: _Outbox = {}
        stop = asyncio.Event()
        counted = [0]
        resend = asyncio.create_task(self._resend(sent, stop, counted))
        try:
            done = await self._micro_batches(run, round_, params, x, y, rows, sent)
            done.resent = counted[0]
            own = Gradient(done.grads)
            await self.peer.publish(
                own, round_, rows, step=self.stage, timeout=self.config.rounds.deadline_s
            )
            got = await self.peer.await_result(
                round_, step=self.stage, timeout=self.config.rounds.deadline_s + 30.0
            )
            new = apply({n: params[n] for n in own.tensors}, got.gradient, lr)
            # the neighbours may still be waiting for what this replica sent
            await self.peer.await_result(round_, timeout=self.config.rounds.deadline_s + 30.0)
            return new, done
        finally:
            stop.set()
            resend.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await resend

    async def _resend(self, sent: _Outbox, stop: asyncio.Event, counted: list[int]) -> None:
        """Send each unanswered message again when it is due, doubling its wait: pubsub may
        drop a message, but re-sending every message on every tick costs the sender (and the
        node) a publish per message per tick while the pipeline is busy."""
        topic = pipeline_topic(self.config.job)
        while not stop.is_set():
            now = time.monotonic()
            wake = min((s.due for s in sent.values()), default=now + self.rebroadcast_s)
            if wake > now:
                await asyncio.sleep(min(wake - now, self.rebroadcast_s))
                continue
            for entry in list(sent.values()):
                if entry.due <= now:
                    entry.gap = min(entry.gap * 2, MAX_RESEND_GAP_S)
                    entry.due = now + entry.gap
                    counted[0] += 1
                    await self.node.publish(topic, entry.data)

    async def _send(
        self,
        run: str,
        round_: int,
        mb: int,
        direction: Direction,
        value: Array,
        sent: _Outbox,
        out: ReplicaRound,
    ) -> CID:
        """Put ``value`` as a document and announce it to this lane's neighbour."""
        t0 = time.perf_counter()
        to = self.stage_index + (1 if direction == FORWARD else -1)
        kind = "activation" if direction == FORWARD else "activation-grad"
        meta = self._meta(kind, round_, mb)
        cid = await self.store.put(Gradient({ACTIVATION: np.ascontiguousarray(value)}, meta))
        msg = StageMessage(
            direction,
            self.config.job,
            run,
            round_,
            mb,
            self.pipe.stages[to].name,
            self.replica,
            self.key.did,
            cid,
            int(time.time() * 1000),
        )
        data = encode_stage_message(msg, self.key)
        await self.node.publish(pipeline_topic(self.config.job), data)
        gap = self.rebroadcast_s
        sent[(direction, mb)] = _Sent(data, time.monotonic() + gap, gap)
        out.put_s += time.perf_counter() - t0
        return cid

    def _meta(self, kind: str, round_: int, mb: int | None = None) -> dict[str, object]:
        """The meta of a document this replica stores (docs/spec.md, section 11.1): what it
        is, and whose, so an audit can tell that an input, parameters and an output belong
        together (``audit.verify_stage``)."""
        meta: dict[str, object] = {"kind": kind, "job": self.config.job, "round": round_}
        if mb is not None:
            meta["micro_batch"] = mb
        return {**meta, "stage": self.stage, "peer": self.key.did}

    async def _fetch(
        self, msg: StageMessage, columns: int, rows: int | None, out: ReplicaRound
    ) -> Array:
        """The activation at ``msg.cid``, verified block by block: one float64 tensor of the
        expected shape (docs/spec.md section 11.3), else ``schema-mismatch``."""
        t0 = time.perf_counter()
        got = await asyncio.wait_for(self.store.get(msg.cid), self.pipe.deadline_s)
        out.fetch_s += time.perf_counter() - t0
        value = got.tensors.get(ACTIVATION)
        if (
            value is None
            or len(got.tensors) != 1
            or value.dtype != np.float64
            or value.ndim != 2
            or value.shape[1] != columns
            or (rows is not None and value.shape[0] != rows)
        ):
            raise PipelineError(
                Reason.SCHEMA_MISMATCH,
                f"micro-batch {msg.micro_batch} from {msg.sender}: {msg.cid} is not one "
                f"{ACTIVATION!r} float64 tensor of {rows or 'n'} x {columns}",
            )
        return np.asarray(value)

    async def _micro_batches(
        self,
        run: str,
        round_: int,
        params: Params,
        x: Sequence[Array] | None,
        y: Sequence[Array] | None,
        rows: int,
        sent: _Outbox,
    ) -> ReplicaRound:
        """Every micro-batch through this stage, forward and back (see ``train_round``)."""
        m = self.pipe.micro_batches
        if self.first and (x is None or len(x) != m):
            raise ValueError(f"the first stage needs {m} input micro-batches")
        if self.last and (y is None or len(y) != m):
            raise ValueError(f"the last stage needs {m} label micro-batches")
        w, _ = self.layer.names()
        fan_in, fan_out = params[w].shape[1], params[w].shape[0]
        out = ReplicaRound(grads={})
        names = self.layer.names()
        out.params = await self.store.put(
            Gradient({n: params[n] for n in names}, self._meta(STAGE_PARAMS, round_))
        )
        per_mb: dict[int, Params] = {}
        cache: dict[int, tuple[Array, Array]] = {}
        losses: dict[int, float] = {}
        seen: dict[tuple[str, int], CID] = {}
        start = time.perf_counter()
        deadline = time.monotonic() + self.pipe.deadline_s
        next_mb = 0
        while len(per_mb) < m:
            if self.first and next_mb < m and next_mb - len(per_mb) < self.pipe.in_flight:
                assert x is not None
                t0 = time.perf_counter()
                xs = np.ascontiguousarray(x[next_mb], dtype=np.float64)
                meta = self._meta(STAGE_INPUT, round_, next_mb)
                out.inputs[next_mb] = await self.store.put(Gradient({ACTIVATION: xs}, meta))
                out.put_s += time.perf_counter() - t0
                act = self.layer.forward(params, xs)
                cache[next_mb] = (xs, act)
                out.outputs[next_mb] = await self._send(
                    run, round_, next_mb, FORWARD, act, sent, out
                )
                out.busy_s += time.perf_counter() - t0
                next_mb += 1
                continue
            t0 = time.perf_counter()
            msg = await self._arrival(run, round_, deadline, seen, per_mb, cache, out)
            t1 = time.perf_counter()
            out.bubble_s += t1 - t0
            mb = msg.micro_batch
            if msg.type == FORWARD:
                xs = await self._fetch(msg, fan_in, None if y is None else len(y[mb]), out)
                out.inputs[mb] = msg.cid
                if self.last:
                    assert y is not None
                    loss, gx, per_mb[mb] = self.layer.loss_backward(params, xs, y[mb], rows)
                    losses[mb] = loss
                    await self._send(run, round_, mb, BACKWARD, gx, sent, out)
                else:
                    act = self.layer.forward(params, xs)
                    cache[mb] = (xs, act)
                    out.outputs[mb] = await self._send(run, round_, mb, FORWARD, act, sent, out)
            else:
                sent.pop((FORWARD, mb), None)  # answered: the activation arrived
                xs, act = cache.pop(mb)
                g = await self._fetch(msg, fan_out, act.shape[0], out)
                gx, per_mb[mb] = self.layer.backward(params, xs, act, g)
                if not self.first:
                    await self._send(run, round_, mb, BACKWARD, gx, sent, out)
            out.busy_s += time.perf_counter() - t1
        # summed in micro-batch order: the same bits whatever order they arrived in
        out.grads = {n: sum((per_mb[i][n] for i in range(1, m)), per_mb[0][n]) for n in names}
        if self.last:
            out.loss = sum(losses[i] for i in range(m))
        out.wall_s = time.perf_counter() - start
        return out

    async def _arrival(
        self,
        run: str,
        round_: int,
        deadline: float,
        seen: dict[tuple[str, int], CID],
        done: dict[int, Params],
        cache: dict[int, tuple[Array, Array]],
        out: ReplicaRound,
    ) -> StageMessage:
        """The next new, verified message this replica can use now; ``MicroBatchMissing``
        names the micro-batches still owed at the deadline."""
        assert self._sub is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._missing(round_, done, cache)
            try:
                raw = await self._sub.get(timeout=left)
            except TimeoutError:
                raise self._missing(round_, done, cache) from None
            msg = self._verify(raw.data, run, round_, out)
            if msg is None:
                continue
            key = (msg.type, msg.micro_batch)
            if key in seen:
                if seen[key] != msg.cid:
                    out.refused.append(
                        reason_text(
                            Reason.CONFLICTING_CID,
                            f"micro-batch {msg.micro_batch} was {seen[key]}, now {msg.cid}",
                        )
                    )
                continue
            if msg.type == BACKWARD and msg.micro_batch not in cache:
                out.refused.append(
                    reason_text(
                        Reason.OUT_OF_RANGE, f"a gradient for unsent micro-batch {msg.micro_batch}"
                    )
                )
                continue
            seen[key] = msg.cid
            return msg

    def _verify(self, data: bytes, run: str, round_: int, out: ReplicaRound) -> StageMessage | None:
        """The message if it is for this replica in either direction it takes, else None
        (another replica's is skipped; a refusal is kept in ``out.refused``)."""
        directions: list[Direction] = []
        if not self.first:
            directions.append(FORWARD)
        if not self.last:
            directions.append(BACKWARD)
        last: MessageError | None = None
        for direction in directions:
            try:
                return verify_stage_message(
                    data,
                    job=self.config.job,
                    run=run,
                    round_=round_,
                    stage=self.stage,
                    replica=self.replica,
                    direction=direction,
                    pipeline=self.pipe,
                )
            except MessageError as exc:
                last = exc
        assert last is not None
        if last.code in (Reason.UNKNOWN_STEP, Reason.UNEXPECTED_TYPE):
            return None  # another stage's or replica's: not ours to refuse
        out.refused.append(str(last))
        return None

    def _missing(
        self, round_: int, done: dict[int, Params], cache: dict[int, tuple[Array, Array]]
    ) -> MicroBatchMissing:
        owed = [i for i in range(self.pipe.micro_batches) if i not in done]
        what = (
            "activation gradients" if self.first or any(i in cache for i in owed) else "activations"
        )
        return MicroBatchMissing(
            Reason.ABSENT,
            f"stage {self.stage!r} replica {self.replica}, round {round_}: micro-batches "
            f"{', '.join(map(str, owed))} got no {what} within {self.pipe.deadline_s}s",
        )


def micro_batches(values: Array, count: int) -> list[Array]:
    """``values`` cut into ``count`` consecutive micro-batches (sizes differ by at most one)."""
    return [np.ascontiguousarray(part) for part in np.array_split(values, count)]
