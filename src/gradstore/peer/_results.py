"""What a round gives a peer: its result (or each step's) with the aggregate fetched and
verified, awaited from the coordinator's signed messages; and applying an aggregate.

A result stamped before the peer began to listen may be a replay from an earlier run; the
coordinator re-sends its results with fresh stamps, so only those stamped since count.
Once a stepped round's own result is out its steps' results are no longer re-sent: a step
whose result the peer missed is read from the round/5 record (``_round_record``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from ..dag import CID
from ..errors import RoundFailedError
from ..format import Gradient
from ..job import JobConfig
from ..node import Node
from ..store import GradientStore
from ._listen import DEFAULT_COORDINATOR_TIMEOUT_S, CoordinatorListener
from ._round_record import RoundRecords
from ._steps import known_step
from ._view import Outcome

#: Closed steps' aggregates a peer fetches at once (``step_results``): a step's aggregate
#: is fetched while the next steps close, not after the one before it.
STEP_FETCHES: Final = 4


@dataclass(frozen=True)
class AggregateResult:
    """A round's verified result: the coordinator's signed message and the fetched aggregate.

    With ``step`` (a stepped job), one step's: ``cid`` its aggregate, ``record`` its step
    record. A stepped round's own result (step None) has the model-level output as ``cid``
    and its round/5 record as ``record``.
    """

    round: int
    cid: CID
    record: CID
    peers: tuple[str, ...]
    gradient: Gradient
    step: str | None = None


@dataclass(frozen=True)
class StepFailed:
    """A step of a round that ended without an aggregate, and why (``step_results`` yields
    it; step None: the round of a job without steps)."""

    round: int
    step: str | None
    reason: str


class ResultListener(CoordinatorListener):
    """A ``CoordinatorListener`` that awaits a round's result, or each of its steps', and
    fetches the aggregates from its node."""

    def __init__(
        self,
        config: JobConfig,
        node: Node,
        *,
        coordinator_timeout_s: float = DEFAULT_COORDINATOR_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        listener: CoordinatorListener | None = None,
    ) -> None:
        super().__init__(
            config,
            node,
            coordinator_timeout_s=coordinator_timeout_s,
            clock=clock,
            listener=listener,
        )
        self.store = GradientStore(node, limits=config.limits)
        self.records = RoundRecords(config, node)
        #: The aggregate being fetched (None: none), and the bytes of it fetched so far:
        #: what a waiting command shows once the coordinator's result has come.
        self.fetching: CID | None = None
        self.fetched_bytes = 0

    async def await_result(
        self, round_: int, *, step: str | None = None, timeout: float | None = None
    ) -> AggregateResult:
        """Wait for the round's signed result (or, in a stepped job, its ``step``'s), then
        fetch and verify the aggregate.

        Without ``step``, a stepped round's result is the model-level output (every closed
        step's tensors) and its round/5 record. A step whose result was missed is read from
        the round/5 record once the round's result is out. Raises ``RoundFailedError`` as
        soon as the coordinator says the round (or the step) failed, ``CoordinatorError``
        when the coordinator is silent for ``coordinator_timeout_s``, and ``MessageError``
        (or ``IntegrityError``) for a record that is not the one the round's result names.
        """
        step = known_step(self.config, step)
        deadline = None if timeout is None else time.monotonic() + timeout
        # a result stamped before we began to listen may be a replay from an earlier run;
        # the coordinator re-sends its last result with a fresh stamp, so wait for that one
        since_ms = self._listening_since_ms

        def known() -> bool:
            return self.view.outcome(round_, since_ms, step).known or self._in_record(
                round_, since_ms, step
            )

        if not await self._wait(known, None, deadline):
            raise TimeoutError(
                f"no result for round {round_}{of_step(step)} of job {self.config.job} "
                f"within {timeout}s"
            )
        outcome = await self.step_outcome(round_, since_ms, step)
        if outcome.result is None:
            raise RoundFailedError(self.config.job, round_, outcome.failed or "failed", step=step)
        return await self._fetch(round_, step, outcome)

    async def step_results(
        self, round_: int, *, timeout: float | None = None
    ) -> AsyncIterator[AggregateResult | StepFailed]:
        """Each step's result of ``round_`` as the step ends: an ``AggregateResult`` (with its
        aggregate fetched and verified) for a step that closed, in the order their fetches
        end (up to ``STEP_FETCHES`` at once, as the steps end), a ``StepFailed`` for one that
        failed, so one failed step hides no other. It yields every step of the job, not only
        this peer's (applying the round needs every step's aggregate), and stops once each
        has ended.

        A job without steps yields its round's result (or failure, step None) once.
        Once the round's result is out, the steps not heard of are read from its round/5
        record, in the job's order. ``TimeoutError`` if no further step ends within
        ``timeout`` of the call; ``CoordinatorError`` and ``MessageError`` as ``await_result``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        since_ms = self._listening_since_ms
        if not self.config.stepped:
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                yield await self.await_result(round_, timeout=left)
            except RoundFailedError as exc:
                yield StepFailed(round_, None, exc.reason)
            return
        done: set[str] = set()
        fetches: set[asyncio.Task[AggregateResult]] = set()  # closed steps' aggregates
        waiter: asyncio.Task[bool] | None = None  # for the next steps to end
        limit = asyncio.Semaphore(STEP_FETCHES)

        def ended() -> list[tuple[str, Outcome]]:
            return [e for e in self.view.steps_ended(round_, since_ms) if e[0] not in done]

        def rest() -> list[str]:
            """The steps not ended yet, once the round's result is out (its record has them)."""
            if self.view.outcome(round_, since_ms).result is None:
                return []
            return [s for s in self.view.steps if s not in done]

        async def fetch(step: str, outcome: Outcome) -> AggregateResult:
            async with limit:
                return await self._fetch(round_, step, outcome)

        try:
            while len(done) < len(self.view.steps) or fetches:
                if waiter is None and len(done) < len(self.view.steps):
                    waiter = asyncio.create_task(
                        self._wait(lambda: bool(ended() or rest()), None, deadline)
                    )
                waits = fetches if waiter is None else {*fetches, waiter}
                over, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for task in fetches & over:
                    fetches.discard(task)
                    yield task.result()
                if waiter is None or waiter not in over:
                    continue
                if not waiter.result():
                    waiting = [s for s in self.view.steps if s not in done]
                    raise TimeoutError(
                        f"round {round_} of job {self.config.job}: steps {waiting} did not "
                        f"end within {timeout}s"
                    )
                waiter = None
                ends = ended()
                for step in rest():  # results missed: the round/5 record has them
                    if step not in {s for s, _ in ends}:
                        ends.append((step, await self.step_outcome(round_, since_ms, step)))
                for step, outcome in ends:
                    done.add(step)
                    if outcome.result is None:
                        yield StepFailed(round_, step, outcome.failed or "failed")
                    else:  # fetched while the next steps close
                        fetches.add(asyncio.create_task(fetch(step, outcome)))
        finally:
            unfinished: list[asyncio.Task[Any]] = [*fetches, *([] if waiter is None else [waiter])]
            for pending in unfinished:
                pending.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)

    def _in_record(self, round_: int, since_ms: int, step: str | None) -> bool:
        """Whether ``step``'s outcome, not heard of, is to be read from the round/5 record:
        the round's own result is out (stamped since ``since_ms``)."""
        if step is None or self.view.outcome(round_, since_ms, step).known:
            return False
        return self.view.outcome(round_, since_ms).result is not None

    async def step_outcome(self, round_: int, since_ms: int, step: str | None) -> Outcome:
        """How ``round_`` (its ``step``) ended, as the coordinator's messages stamped since
        ``since_ms`` say; for a step they did not, as the round/5 record the round's result
        names says (``_round_record``); else not known yet."""
        outcome = self.view.outcome(round_, since_ms, step)
        if not self._in_record(round_, since_ms, step):
            return outcome
        assert step is not None
        whole = self.view.outcome(round_, since_ms).result
        assert whole is not None
        return await self.records.step_outcome(whole, step)

    async def _fetch(self, round_: int, step: str | None, outcome: Outcome) -> AggregateResult:
        """The closed round's (or step's) result with its aggregate fetched from the node."""
        result = outcome.result
        assert result is not None
        self.fetching, self.fetched_bytes = CID.parse(result.cid), 0

        def moved(done: int, total: int) -> None:
            self.fetched_bytes = done

        try:
            gradient = await self.store.get(result.cid, progress=moved)
        finally:
            self.fetching = None
        return AggregateResult(
            round_,
            CID.parse(result.cid),
            CID.parse(result.record),
            self.config.roster.members(outcome.peers),
            gradient,
            step,
        )


def of_step(step: str | None) -> str:
    """What a message about a step adds after its round (nothing without a step)."""
    return "" if step is None else f", step {step!r}"


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
