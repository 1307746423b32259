"""One round of a stepped job streamed out of ``loss.backward()``: each of the peer's steps is
put and announced as soon as autograd has produced its gradients, while backward goes on
through the earlier layers, and each step's aggregate is written into its parameters'
``.grad`` as its result arrives.

Autograd's thread only hands a ready step to the peer's event loop (never waits on the
network there); the loop converts it (``to_gradient`` shares CPU memory), stores and
announces it, and applies every step's result, its own or not. A step's ``.grad`` is
written only once autograd is done with it and this peer's document of it is stored, so
nothing sent is changed under the store. A step that failed has its parameters' ``.grad``
set to None (``optimizer.step()`` then leaves them, as on every other peer) and, once every
other step is applied, ``StepsFailedError`` says which.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from .._sync import LoopThread
from ..errors import CoordinatorError, RefusedError, RoundFailedError, StepError
from ..peer import AggregateResult, Peer, StepFailed
from ._convert import to_gradient
from ._params import Parameters, named_parameters, write_grads
from ._stream import ReadyStep, StepStream

log = logging.getLogger(__name__)


class StepsFailedError(RoundFailedError):
    """Steps of a streamed round ended without an aggregate. Every other step was applied;
    the failed steps' parameters have ``.grad`` None. ``failed`` maps each failed step to
    the coordinator's reason, ``results`` each applied step to its result; ``step`` is the
    first failed step in closing order."""

    def __init__(
        self,
        job: str,
        round_: int,
        failed: Mapping[str, str],
        results: Mapping[str, AggregateResult],
    ) -> None:
        self.failed = dict(failed)
        self.results = dict(results)
        first, reason = next(iter(self.failed.items()))
        super().__init__(job, round_, reason, step=first)
        listed = "; ".join(f"step {name!r}: {why}" for name, why in self.failed.items())
        self.args = (
            f"round {round_} of job {job}: {len(self.failed)} step(s) failed ({listed}); "
            f"the other {len(self.results)} applied, the failed steps' .grad set to None",
        )


class StreamedRound:
    """A peer's round streamed out of backward, on the peer's event loop; asyncio's face::

        async with StreamedRound(peer, model, round_, num_samples) as s:
            await asyncio.to_thread(loss.backward)   # steps go out while it runs
        # here every step's aggregate is in .grad; s.results maps step -> AggregateResult

    ``peer`` is an entered :class:`~gradstore.peer.Peer` of a stepped job, with its key.
    Leaving the block hands out the steps still waiting (parameters the loss did not reach,
    as :meth:`StepStream.finish` does), removes the hooks and waits until every step of
    the job is applied or failed (``timeout``: for each next step's end).
    """

    def __init__(
        self,
        peer: Peer,
        model: Parameters,
        round_: int,
        num_samples: int,
        *,
        timeout: float | None = 600.0,
    ) -> None:
        config = peer.config
        if not config.stepped:
            raise StepError(
                f"job {config.job!r} has no [[steps]]: there is nothing to stream "
                "(sync_grads publishes the whole gradient)"
            )
        if peer.key is None:
            raise CoordinatorError("streaming a round needs the peer's key")
        self.peer = peer
        self.round = round_
        self.num_samples = num_samples
        self.timeout = timeout
        params = named_parameters(model)
        self._stream = StepStream(list(params.items()), config.plan, on_ready=self._handed)
        members = config.plan.partition(params)
        self._members = {step: {n: params[n] for n in names} for step, names in members.items()}
        self._mine = frozenset(peer.steps.own())  # StepError when the peer is in no step
        #: When each step was handed out of backward, stored (its announcement then
        #: starts), and applied: ``time.monotonic()`` seconds.
        self.ready_at: dict[str, float] = {}
        self.stored_at: dict[str, float] = {}
        self.applied_at: dict[str, float] = {}
        #: Each applied step's result, in the order they were applied.
        self.results: dict[str, AggregateResult] = {}
        #: Each failed step's reason, from the coordinator.
        self.failed: dict[str, str] = {}
        #: This peer's steps whose input the coordinator refused (the step may have closed
        #: without it: its aggregate is applied all the same).
        self.refused: dict[str, RefusedError] = {}
        self._ready = {step: asyncio.Event() for step in self._members}
        self._stored = {step: asyncio.Event() for step in self._mine}
        self._publishing: dict[str, asyncio.Task[None]] = {}
        self._applying: list[asyncio.Task[None]] = []
        self._listening: asyncio.Task[None] | None = None
        self._error: Exception | None = None  # the first error publishing a step
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> StreamedRound:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self._stream.close()
            await self.cancel()
            return
        try:
            self.finish()
        except BaseException:
            await self.cancel()
            raise
        await self.wait()

    async def start(self) -> None:
        """Listen for the round's step results and register the hooks (on the peer's loop)."""
        if self._loop is not None:
            raise RuntimeError("a StreamedRound streams one backward pass: make another")
        self._loop = asyncio.get_running_loop()
        self._listening = asyncio.create_task(self._listen(), name=f"round-{self.round}-results")
        self._stream.open()

    def finish(self) -> None:
        """After backward (in any thread): hand out the steps still waiting and remove the
        hooks."""
        try:
            self._stream.finish()
        finally:
            self._stream.close()

    async def wait(self) -> dict[str, AggregateResult]:
        """Until every step of the job is applied or failed; returns ``results``.

        An error storing or announcing one of this peer's steps, other than a refusal, is
        raised at once (the round is cancelled, ``.grad`` partly applied); a refusal is
        kept in ``refused``. ``StepsFailedError`` once the others are applied if any step
        failed.
        """
        listening = self._listening
        if listening is None:
            raise RuntimeError("start() the StreamedRound first")
        try:
            await asyncio.wait([listening])  # a publishing error cancels it
            if self._error is not None:
                raise self._error
            listening.result()  # TimeoutError, CoordinatorError
            await asyncio.gather(*self._applying)
        except BaseException:
            await self.cancel()
            raise
        # every step has ended: an announcement still waiting for its verdict has no more
        # bearing on what this peer applies
        await self._stop(list(self._publishing.values()))
        if self.failed:
            raise StepsFailedError(self.peer.config.job, self.round, self.failed, self.results)
        return self.results

    async def cancel(self) -> None:
        """Remove the hooks and stop listening, storing and announcing."""
        self._stream.close()
        tasks = [*self._publishing.values(), *self._applying]
        if self._listening is not None:
            tasks.append(self._listening)
        await self._stop(tasks)

    # -- in autograd's thread --------------------------------------------------------------

    def _handed(self, ready: ReadyStep) -> None:
        """StepStream's callback: note the time and pass the step to the loop; no waiting."""
        self.ready_at[ready.name] = time.monotonic()
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._on_ready, ready)

    # -- on the peer's loop ----------------------------------------------------------------

    def _on_ready(self, ready: ReadyStep) -> None:
        if ready.name in self._mine:
            self._publishing[ready.name] = asyncio.create_task(
                self._publishing_step(ready), name=f"round-{self.round}-publish-{ready.name}"
            )
        self._ready[ready.name].set()

    async def _publish(self, ready: ReadyStep) -> None:
        """Store the step's gradients (their CPU memory shared) and announce them until the
        coordinator verified them."""
        name, peer = ready.name, self.peer
        try:
            if all(t.device.type == "cpu" for t in ready.grads.values()):
                gradient = to_gradient(ready.grads, {"kind": "gradient"})
            else:  # a copy to host memory: not on the loop
                gradient = await asyncio.to_thread(to_gradient, ready.grads, {"kind": "gradient"})
            document = peer.prepare(gradient, self.round, self.num_samples, step=name)
            cid = await peer.store.put(document)
            self.stored_at[name] = time.monotonic()
        finally:
            self._stored[name].set()  # the .grad may be written now
        try:
            await peer.announce(cid, self.round, self.num_samples, step=name, timeout=self.timeout)
        except RefusedError as exc:
            self.refused[name] = exc
            log.warning("round %d: %s", self.round, exc)

    async def _publishing_step(self, ready: ReadyStep) -> None:
        """``_publish``, an error other than a refusal stopping the round: ``wait`` raises it."""
        try:
            await self._publish(ready)
        except Exception as exc:
            if self._error is None:
                self._error = exc
            if self._listening is not None:
                self._listening.cancel()

    async def _listen(self) -> None:
        async for item in self.peer.step_results(self.round, timeout=self.timeout):
            self._applying.append(asyncio.create_task(self._apply(item)))

    async def _apply(self, item: AggregateResult | StepFailed) -> None:
        """Write a step's aggregate into its parameters' ``.grad`` (None if it failed), once
        autograd is done with them and this peer's document of them is stored."""
        name = item.step
        assert name is not None
        await self._ready[name].wait()
        if name in self._stored:
            await self._stored[name].wait()
        params = self._members[name]
        if isinstance(item, StepFailed):
            for p in params.values():
                p.grad = None
            self.failed[name] = item.reason
            return
        write_grads(params, item.gradient, f"aggregate of step {name!r}")
        self.results[name] = item
        self.applied_at[name] = time.monotonic()

    @staticmethod
    async def _stop(tasks: list[asyncio.Task[Any]]) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class SyncStreamedRound:
    """:class:`StreamedRound` for a synchronous loop (``TorchPeer.streaming``)::

        with peer.streaming(model, round_, num_samples) as s:
            loss.backward()
        optimizer.step()          # .grad is the round's aggregate, step by step

    Leaving the block waits until every step is applied (``StepsFailedError`` if some
    failed: the others are applied, the failed ones' ``.grad`` is None).
    """

    def __init__(self, loop: LoopThread, inner: StreamedRound) -> None:
        self._loop = loop
        self.inner = inner

    def __enter__(self) -> SyncStreamedRound:
        self._loop.run(self.inner.start())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self._loop.run(self.inner.cancel())  # removes the hooks too
            return
        try:
            self.inner.finish()
        except BaseException:
            self._loop.run(self.inner.cancel())
            raise
        self._loop.run(self.inner.wait())

    @property
    def results(self) -> dict[str, AggregateResult]:
        """Each applied step's result, in the order they were applied."""
        return self.inner.results

    @property
    def failed(self) -> dict[str, str]:
        """Each failed step's reason."""
        return self.inner.failed

    @property
    def refused(self) -> dict[str, RefusedError]:
        """This peer's steps the coordinator refused (applied if they closed without it)."""
        return self.inner.refused

    @property
    def ready_at(self) -> dict[str, float]:
        """When each step came out of backward (``time.monotonic()``)."""
        return self.inner.ready_at

    @property
    def stored_at(self) -> dict[str, float]:
        """When each of this peer's steps was stored, its announcement starting."""
        return self.inner.stored_at

    @property
    def applied_at(self) -> dict[str, float]:
        """When each step's aggregate was written into ``.grad``."""
        return self.inner.applied_at
