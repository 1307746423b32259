"""Peer side of a job: publish a gradient for a round, await the round's aggregate.

Pubsub has no delivery guarantee, so a peer re-announces with backoff until the
coordinator's signed status shows its input received, then waits until it is verified or
refused. Announcements carry the coordinator's run id, which the peer learns from the
coordinator's own signed, fresh status (``CoordinatorView``), so no message of an
earlier run of the same job is trusted or answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, overload

import numpy as np

from ..dag import CID
from ..errors import (
    ConfigError,
    CoordinatorError,
    MessageError,
    NodeError,
    Reason,
    RefusedError,
    RoundFailedError,
    reason_detail,
)
from ..format import CompressedGradient, Gradient
from ..job import JobConfig
from ..messages import (
    Announce,
    PeerLists,
    Result,
    SigningKey,
    Status,
    decode_lists,
    encode_message,
    inline_lists,
    verify_message,
)
from ..messages.refusal_log import RefusalLog
from ..node import Node, Retry, follow
from ..store import GradientStore
from ._view import CoordinatorView, Standing

log = logging.getLogger("gradstore.peer")

#: How long a peer waits for a word from its coordinator before saying it is not there.
DEFAULT_COORDINATOR_TIMEOUT_S: Final = 15.0

#: A round that is over without a word about our input: wait this long for its result.
_OVER_GRACE_S: Final = 3.0

#: Lists blocks a peer keeps (by CID), so a repeated status costs no fetch.
_LISTS_CACHE: Final = 16


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
    With ``listener`` (another, entered ``Peer``) it hears the coordinator through that
    peer's subscription instead of its own.
    """

    def __init__(
        self,
        config: JobConfig,
        node: Node,
        key: SigningKey | None = None,
        *,
        first_backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
        coordinator_timeout_s: float = DEFAULT_COORDINATOR_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        listener: Peer | None = None,
    ) -> None:
        if key is not None and key.did not in config.roster:
            raise ConfigError(f"{key.did} is not among the job's peers")
        self.config = config
        self.key = key
        self.node = node
        self.store = GradientStore(node, limits=config.limits)
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.coordinator_timeout_s = coordinator_timeout_s
        self.clock = clock
        self.announcements_sent = 0
        self.view = CoordinatorView(config.roster)
        self._heard_at: float | None = None  # monotonic time of the last fresh coordinator message
        self._started_at = 0.0
        self._listening_since_ms = 0
        self._skew_warned = False
        # junk on the results topic: a line per reason, then sums
        self._ignored = RefusalLog(verb="ignored")
        self._lists: dict[str, PeerLists] = {}
        self._news = asyncio.Condition()
        self._sub: object = None
        self._reader: asyncio.Task[None] | None = None
        self._listener = listener

    async def __aenter__(self) -> Peer:
        if self._listener is not None:
            # Many peers in one process (simulations, benchmarks) hear the coordinator through
            # one subscription: its messages are decoded and verified once, not once per peer.
            hub = self._listener
            if hub._reader is None:
                raise CoordinatorError("enter the listener Peer before the peers that share it")
            self.view, self._news, self._reader = hub.view, hub._news, hub._reader
            self._started_at, self._listening_since_ms = hub._started_at, hub._listening_since_ms
            return self
        sub = self.node.subscribe(self.config.results_topic)
        await sub.__aenter__()
        self._sub = sub
        self._started_at = time.monotonic()
        self._listening_since_ms = int(self.clock() * 1000)
        self._reader = asyncio.create_task(self._read(sub), name="peer-results-reader")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._listener is not None:
            return
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._sub is not None:
            await self._sub.__aexit__(None, None, None)  # type: ignore[attr-defined]

    @property
    def run(self) -> str | None:
        """The coordinator's current run id, once heard."""
        return None if self.view.current is None else self.view.current.run

    # -- reading the coordinator ---------------------------------------------------------
    async def _read(self, sub: object) -> None:
        cfg = self.config
        async for msg in follow(self.node, sub):  # type: ignore[arg-type]
            summary = self._ignored.summary(time.monotonic())
            if summary is not None:
                log.warning("on %s: %s", cfg.results_topic, summary)
            try:
                parsed = verify_message(
                    msg.data, job=cfg.job, coordinator=cfg.coordinator, peers=cfg.roster
                )
            except MessageError as exc:  # anyone can publish here: no sender to name
                if self._ignored.refused(exc.reason, None, time.monotonic()):
                    log.warning(
                        "ignored a message on %s: %s (repeats are summed up every %.0f s)",
                        cfg.results_topic,
                        exc,
                        self._ignored.every_s,
                    )
                continue
            if not isinstance(parsed, Status | Result):
                continue
            if not self._fresh(parsed.sent_at):
                continue
            try:
                lists = await self._lists_of(parsed)
            except (MessageError, NodeError, TimeoutError) as exc:
                log.warning("ignored a %s whose lists cannot be read: %s", parsed.kind.value, exc)
                continue
            async with self._news:
                if isinstance(parsed, Status):
                    self.view.see_status(parsed, lists)
                else:
                    self.view.see_result(parsed, lists)
                self._heard_at = time.monotonic()
                self._news.notify_all()

    def _fresh(self, sent_at: int) -> bool:
        """Whether a message stamped ``sent_at`` (unix ms) is within the job's skew window."""
        skew_ms = self.config.messages.max_clock_skew_s * 1000
        off = sent_at - self.clock() * 1000
        if abs(off) <= skew_ms:
            return True
        if not self._skew_warned:
            self._skew_warned = True
            log.warning(
                "ignoring coordinator messages stamped %.0f s from this machine's clock "
                "(the job allows %.0f s): replays of an earlier run, or a wrong clock here",
                off / 1000,
                skew_ms / 1000,
            )
        return False

    async def _lists_of(self, msg: Status | Result) -> PeerLists:
        """The message's peer lists: inline, or from the linked block (fetched and verified)."""
        if msg.lists is None:
            return inline_lists(msg)
        cached = self._lists.get(msg.lists)
        if cached is None:
            data = await asyncio.wait_for(self.node.get_block(CID.parse(msg.lists)), 10.0)
            cached = decode_lists(data, msg, self.config.roster)
            if len(self._lists) >= _LISTS_CACHE:
                self._lists.pop(next(iter(self._lists)))
            self._lists[msg.lists] = cached
        return cached

    def _silent_for(self) -> float:
        """Seconds since the coordinator was last heard (or since we started listening)."""
        hub = self._listener or self
        return time.monotonic() - (hub._heard_at or hub._started_at)

    def _no_coordinator(self) -> CoordinatorError:
        cfg = self.config
        hub = self._listener or self
        heard = "has not been heard" if hub._heard_at is None else "has been silent"
        return CoordinatorError(
            f"the coordinator of job {cfg.job} {heard} for {self._silent_for():.0f} s "
            f"on {cfg.results_topic} (is `gradstore coordinator` running, and connected to "
            "this node?)"
        )

    async def _wait(
        self, ready: Callable[[], bool], step: float | None, deadline: float | None
    ) -> bool:
        """Wait until ``ready()``, ``step`` seconds from now, the deadline, or coordinator silence.

        True when ready; raises the "no coordinator" error once the coordinator has been
        silent for ``coordinator_timeout_s``. Messages that leave ``ready()`` false wake the
        wait but do not restart ``step``: the coordinator repeats itself every few seconds.
        """
        until = deadline
        if step is not None:
            stop = time.monotonic() + step
            until = stop if deadline is None else min(deadline, stop)
        async with self._news:
            while True:
                if ready():
                    return True
                silent_left = self.coordinator_timeout_s - self._silent_for()
                if silent_left <= 0:
                    raise self._no_coordinator()
                limit = silent_left if until is None else min(silent_left, until - time.monotonic())
                if limit <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._news.wait(), limit)

    # -- publishing ----------------------------------------------------------------------
    async def publish(
        self,
        gradient: Gradient | CompressedGradient,
        round_: int,
        num_samples: int,
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> CID:
        """Store ``gradient`` (pinned on our node) and announce it until the coordinator has it.

        A ``CompressedGradient`` (``gradstore.compress``) is stored as a gradstore/2 document;
        the coordinator decompresses it when it aggregates.

        With ``wait`` (the default) it returns once the coordinator verified the input, and
        raises ``RefusedError`` with the coordinator's reason as soon as it refuses or
        excludes it. Without ``wait`` it returns after the first announcement.
        """
        cid = await self.store.put(self.prepare(gradient, round_, num_samples))
        return await self.announce(cid, round_, num_samples, wait=wait, timeout=timeout)

    @overload
    def prepare(self, gradient: Gradient, round_: int, num_samples: int) -> Gradient: ...
    @overload
    def prepare(
        self, gradient: CompressedGradient, round_: int, num_samples: int
    ) -> CompressedGradient: ...
    def prepare(
        self, gradient: Gradient | CompressedGradient, round_: int, num_samples: int
    ) -> Gradient | CompressedGradient:
        """``gradient`` with the meta ``publish`` stores it with (round, peer, job, ...)."""
        key = self._signer()
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
        return dataclasses.replace(gradient, meta=meta)

    def _signer(self) -> SigningKey:
        if self._reader is None:
            raise CoordinatorError("use the Peer as `async with Peer(...) as peer`")
        if self.key is None:
            raise CoordinatorError("publishing needs the peer's key")
        return self.key

    async def announce(
        self,
        cid: CID,
        round_: int,
        num_samples: int,
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> CID:
        """Announce a gradient already stored (and pinned) on our node; see ``publish``."""
        key = self._signer()
        deadline = None if timeout is None else time.monotonic() + timeout
        if not await self._wait(lambda: self.run is not None, None, deadline):
            raise TimeoutError(f"round {round_}: no word from the coordinator in {timeout}s")
        delays = Retry(
            retries=None, backoff=self.first_backoff_s, max_backoff=self.max_backoff_s
        ).delays()
        delay = next(delays)
        while True:
            run = self.run
            assert run is not None
            announce = Announce(
                job=self.config.job,
                run=run,
                round=round_,
                peer=key.did,
                cid=str(cid),
                num_samples=num_samples,
                sent_at=int(self.clock() * 1000),
            )
            await self.node.publish(self.config.gradients_topic, encode_message(announce, key))
            self.announcements_sent += 1
            if not wait:
                return cid
            if await self._verdict(round_, run, announce.sent_at, delay, deadline):
                return cid
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"round {round_}: the coordinator did not verify {cid} in {timeout}s"
                )
            delay = next(delays)

    async def _verdict(
        self, round_: int, run: str, since_ms: int, delay: float, deadline: float | None
    ) -> bool:
        """After an announcement stamped ``since_ms``: True once verified; False to announce
        again (not heard of within ``delay``, the run changed, or the deadline passed);
        RefusedError if refused, or as soon as the round failed. Only statuses stamped after
        the announcement count."""
        assert self.key is not None
        did = self.key.did

        def standing() -> tuple[Standing, str | None]:
            return self.view.standing(round_, did, since_ms)

        def moved() -> bool:
            return self.run != run or standing()[0] is not Standing.UNKNOWN

        await self._wait(moved, delay, deadline)
        # A round over without a word about our input: its result may still be on its way,
        # so wait for it until a fixed time. The coordinator's repeated statuses wake the wait
        # but do not move that time (they used to restart it, so it never came).
        over_until: float | None = None
        while self.run == run:  # heard of: wait for the verdict, without re-announcing
            where, reason = standing()
            if where is Standing.VERIFIED:
                return True
            if where in (Standing.REFUSED, Standing.FAILED):
                raise _refusal(where, reason, self.config.job, round_, did)
            if where is Standing.UNKNOWN:
                return False
            until = deadline
            if where is Standing.OVER:
                over_until = over_until or time.monotonic() + _OVER_GRACE_S
                if time.monotonic() >= over_until:
                    raise _refusal(where, reason, self.config.job, round_, did)
                until = over_until if deadline is None else min(deadline, over_until)
            before = (where, reason)

            def changed(before: tuple[Standing, str | None] = before) -> bool:
                return self.run != run or standing() != before

            await self._wait(changed, None, until)
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return False

    # -- results -------------------------------------------------------------------------
    async def await_result(self, round_: int, *, timeout: float | None = None) -> AggregateResult:
        """Wait for the round's signed result, then fetch and verify the aggregate.

        Raises ``RoundFailedError`` as soon as the coordinator's status says the round
        failed, and ``CoordinatorError`` when the coordinator is silent for
        ``coordinator_timeout_s``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        # a result stamped before we began to listen may be a replay from an earlier run;
        # the coordinator re-sends its last result with a fresh stamp, so wait for that one
        since_ms = self._listening_since_ms

        def known() -> bool:
            result, failed = self.view.outcome(round_, since_ms)
            return result is not None or failed is not None

        if not await self._wait(known, None, deadline):
            raise TimeoutError(
                f"no result for round {round_} of job {self.config.job} within {timeout}s"
            )
        result, failed = self.view.outcome(round_, since_ms)
        if result is None:
            raise RoundFailedError(self.config.job, round_, failed or "failed")
        view = self.view.current
        assert view is not None
        peers = self.config.roster.members(view.rounds[round_].result_peers)
        gradient = await self.store.get(result.cid)
        return AggregateResult(
            round_, CID.parse(result.cid), CID.parse(result.record), peers, gradient
        )


def _refusal(where: Standing, reason: str | None, job: str, round_: int, peer: str) -> RefusedError:
    """What a peer raises when its coordinator's statuses say its input will not be aggregated:
    the status's own refusal (its code read, ``UNKNOWN`` if this version does not know it),
    or the peer's reading that the round failed or ended without it."""
    if where is Standing.REFUSED:
        return RefusedError.parse(reason or Reason.REFUSED, peer=peer, round_=round_, job=job)
    code = Reason.ROUND_FAILED if where is Standing.FAILED else Reason.ROUND_OVER
    text = reason or ("failed" if where is Standing.FAILED else "round over")
    detail = reason_detail(text) or text
    return RefusedError(code, detail, reason=text, peer=peer, round_=round_, job=job)


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
