"""Peer side of a job: publish a gradient for a round (or each step of it), await the
aggregate.

Pubsub has no delivery guarantee, so a peer re-announces with backoff until the
coordinator's signed status shows its input received, then waits until it is verified or
refused. A peer with several announcements out (a stepped job's steps) takes the
coordinator's acknowledgements of its other announcements as a sign that it is working
through them: an announcement is sent again only once ``delay`` passed both since it was
sent and since the coordinator last acknowledged one of this peer's announcements (and at
the latest ``max_backoff_s`` after it was sent), so a lost one still goes out again.

Announcements carry the coordinator's run id, which the peer learns from the
coordinator's own signed, fresh status (``CoordinatorView``), so no message of an
earlier run of the same job is trusted or answered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, overload

from ..dag import CID
from ..errors import (
    ConfigError,
    CoordinatorError,
    Reason,
    RefusedError,
    reason_detail,
)
from ..format import CompressedGradient, Gradient
from ..job import DEFAULT_STEP, JobConfig
from ..messages import Announce, SigningKey, encode_message
from ..node import Node, Retry
from ._listen import DEFAULT_COORDINATOR_TIMEOUT_S
from ._results import ResultListener, of_step
from ._steps import G, PeerSteps
from ._view import Outcome, Standing

#: A round that is over without a word about our input: wait this long for its result.
_OVER_GRACE_S: Final = 3.0


@dataclass(frozen=True)
class _Input:
    """One input a peer announces: its CID, round, sample count and step."""

    cid: CID
    round: int
    num_samples: int
    step: str | None


class Peer(ResultListener):
    """One peer of a job, over one node. Use as ``async with Peer(...) as peer``.

    Without a key it can only await results (they are checked against the job's coordinator).
    In a tree job (``[[groups]]``) a peer with a key runs in its group's view of the job: it
    announces to its group's leaf and hears it, and the round's result from the root.
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
        if key is not None and config.tree:  # a tree job: its group's view (its leaf, topics)
            config = config.group_view(config.group_of(key.did).name)
        super().__init__(
            config,
            node,
            coordinator_timeout_s=coordinator_timeout_s,
            clock=clock,
            listener=listener,
        )
        self.key = key
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.announcements_sent = 0
        #: When the coordinator last acknowledged (first said anything of) one of our
        #: announcements (monotonic s; None: not yet).
        self._acked_at: float | None = None
        #: How long the coordinator took to acknowledge our announcements, smoothed (s).
        self._ack_s: float | None = None
        #: The job's steps as this peer publishes them (which are its own, cutting).
        self.steps = PeerSteps(config, None if key is None else key.did)

    # -- publishing ----------------------------------------------------------------------
    async def publish(
        self,
        gradient: Gradient | CompressedGradient,
        round_: int,
        num_samples: int,
        *,
        step: str | None = None,
        wait: bool = True,
        timeout: float | None = None,
    ) -> CID:
        """Store ``gradient`` (pinned on our node) and announce it until the coordinator has it.

        A ``CompressedGradient`` (``gradstore.compress``) is stored as a gradstore/2 document;
        the coordinator decompresses it when it aggregates. In a stepped job ``step`` names
        one of this peer's steps, and ``gradient`` (that step's tensors, or a whole gradient)
        is cut down to the step's tensors; ``StepError`` says what does not fit, before
        anything is stored.

        With ``wait`` (the default) it returns once the coordinator verified the input, and
        raises ``RefusedError`` with the coordinator's reason as soon as it refuses or
        excludes it. Without ``wait`` it returns after the first announcement.
        """
        document = self.prepare(gradient, round_, num_samples, step=step)
        cid = await self.store.put(document)
        return await self.announce(cid, round_, num_samples, step=step, wait=wait, timeout=timeout)

    async def publish_steps(
        self,
        gradient: Gradient | CompressedGradient,
        round_: int,
        num_samples: int,
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> dict[str, CID]:
        """Publish every step of this peer from one whole gradient: each step's tensors are
        stored and announced in the job's (backward) order, then each is awaited as
        ``publish`` awaits one. Returns each step's CID by name.

        Every step is cut and checked before anything is stored. With ``wait``, a refusal of
        one step does not stop the others' announcements: once every step has its verdict,
        the first step's error (in the job's order) is raised. A job without steps publishes
        ``gradient`` whole, under its one step's name (``job.DEFAULT_STEP``).
        """
        key = self._signer()
        if not self.config.stepped:
            cid = await self.publish(gradient, round_, num_samples, wait=wait, timeout=timeout)
            return {DEFAULT_STEP: cid}
        parts = self.steps.cut_steps(gradient, self.steps.own())
        deadline = None if timeout is None else time.monotonic() + timeout
        await self._await_run(round_, timeout, deadline)
        sent: dict[str, tuple[_Input, str, int]] = {}
        for step, part in parts.items():
            cid = await self.store.put(self._with_meta(key, part, round_, num_samples, step))
            one = _Input(cid, round_, num_samples, step)
            sent[step] = (one, *await self._send(key, one))
        if wait:
            outcomes = await asyncio.gather(
                *(
                    self._until_verified(key, one, run, at, deadline, timeout)
                    for one, run, at in sent.values()
                ),
                return_exceptions=True,
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
        return {step: one.cid for step, (one, _, _) in sent.items()}

    @overload
    def prepare(
        self, gradient: Gradient, round_: int, num_samples: int, *, step: str | None = None
    ) -> Gradient: ...
    @overload
    def prepare(
        self,
        gradient: CompressedGradient,
        round_: int,
        num_samples: int,
        *,
        step: str | None = None,
    ) -> CompressedGradient: ...
    def prepare(
        self,
        gradient: Gradient | CompressedGradient,
        round_: int,
        num_samples: int,
        *,
        step: str | None = None,
    ) -> Gradient | CompressedGradient:
        """``gradient`` as ``publish`` stores it: cut down to ``step`` (a stepped job's), with
        the meta that binds it (round, peer, job, ..., and the step)."""
        key = self._signer()
        step = self.steps.check(step)
        return self._with_meta(key, self.steps.cut(gradient, step), round_, num_samples, step)

    def _with_meta(
        self, key: SigningKey, gradient: G, round_: int, num_samples: int, step: str | None
    ) -> G:
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
        if step is not None:
            meta["step"] = step
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
        step: str | None = None,
        wait: bool = True,
        timeout: float | None = None,
    ) -> CID:
        """Announce a gradient already stored (and pinned) on our node; see ``publish``."""
        key = self._signer()
        step = self.steps.check(step)
        deadline = None if timeout is None else time.monotonic() + timeout
        await self._await_run(round_, timeout, deadline)
        one = _Input(cid, round_, num_samples, step)
        run, sent_at = await self._send(key, one)
        if wait:
            await self._until_verified(key, one, run, sent_at, deadline, timeout)
        return cid

    async def _await_run(self, round_: int, timeout: float | None, deadline: float | None) -> None:
        """Wait until the coordinator's run is known (announcements carry it)."""
        if not await self._wait(lambda: self.run is not None, None, deadline):
            raise TimeoutError(f"round {round_}: no word from the coordinator in {timeout}s")

    async def _send(self, key: SigningKey, one: _Input) -> tuple[str, int]:
        """Announce ``one`` once to the current run; returns the run and the stamp."""
        run = self.run
        assert run is not None
        announce = Announce(
            job=self.config.job,
            run=run,
            round=one.round,
            step=one.step,
            peer=key.did,
            cid=str(one.cid),
            num_samples=one.num_samples,
            sent_at=int(self.clock() * 1000),
        )
        await self.node.publish(self.config.gradients_topic, encode_message(announce, key))
        self.announcements_sent += 1
        return run, announce.sent_at

    async def _until_verified(
        self,
        key: SigningKey,
        one: _Input,
        run: str,
        sent_at: int,
        deadline: float | None,
        timeout: float | None,
    ) -> None:
        """After the first announcement (to ``run``, stamped ``sent_at``): announce again with
        backoff until the coordinator verified the input; RefusedError if it will not."""
        delays = Retry(
            retries=None, backoff=self.first_backoff_s, max_backoff=self.max_backoff_s
        ).delays()
        delay = next(delays)
        first = time.monotonic()  # (about) when it first went out
        while not await self._verdict(
            one.round, run, sent_at, delay, deadline, one.step, first_sent=first
        ):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"round {one.round}{of_step(one.step)}: the coordinator did not verify "
                    f"{one.cid} in {timeout}s"
                )
            delay = next(delays)
            run, sent_at = await self._send(key, one)

    async def _verdict(
        self,
        round_: int,
        run: str,
        since_ms: int,
        delay: float,
        deadline: float | None,
        step: str | None = None,
        *,
        first_sent: float | None = None,
    ) -> bool:
        """After an announcement stamped ``since_ms`` (the input first announced at monotonic
        ``first_sent``): True once verified; False to announce
        again (not heard of within ``delay``, the run changed, or the deadline passed);
        RefusedError if refused, or as soon as the round (or its step) failed. Only
        statuses stamped after the announcement count."""
        assert self.key is not None
        did = self.key.did

        def standing() -> tuple[Standing, str | None]:
            return self.view.standing(round_, did, since_ms, step)

        def moved() -> bool:
            return self.run != run or standing()[0] is not Standing.UNKNOWN

        if await self._until_heard(moved, delay, deadline, step) and self.run == run:
            self._acked_at = now = time.monotonic()  # heard of: the coordinator is at work
            if first_sent is not None:
                took = now - first_sent
                self._ack_s = took if self._ack_s is None else 0.75 * self._ack_s + 0.25 * took
        # A round over without a word about our input: its result may still be on its way,
        # so wait for it until a fixed time. The coordinator's repeated statuses wake the wait
        # but do not move that time (they used to restart it, so it never came).
        over_until: float | None = None
        while self.run == run:  # heard of: wait for the verdict, without re-announcing
            if self._in_record(round_, since_ms, step):  # the step's result was missed
                assert step is not None
                outcome = await self.step_outcome(round_, since_ms, step)
                return self._verdict_of(outcome, round_, step)
            where, reason = standing()
            if where is Standing.VERIFIED:
                return True
            if where in (Standing.REFUSED, Standing.FAILED):
                raise _refusal(where, reason, self.config.job, round_, did, step)
            if where is Standing.UNKNOWN:
                return False
            until = deadline
            if where is Standing.OVER:
                over_until = over_until or time.monotonic() + _OVER_GRACE_S
                if time.monotonic() >= over_until:
                    raise _refusal(where, reason, self.config.job, round_, did, step)
                until = over_until if deadline is None else min(deadline, over_until)
            before = (where, reason)

            def changed(before: tuple[Standing, str | None] = before) -> bool:
                return (
                    self.run != run
                    or standing() != before
                    or self._in_record(round_, since_ms, step)
                )

            await self._wait(changed, None, until, step)
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return False

    async def _until_heard(
        self,
        moved: Callable[[], bool],
        delay: float,
        deadline: float | None,
        step: str | None = None,
    ) -> bool:
        """After an announcement: wait until ``moved()`` (True), or until ``delay`` (at least
        twice the time our acknowledgements take, smoothed, up to ``max_backoff_s``) passed
        since it was sent and since the coordinator last acknowledged another of our
        announcements, but no longer than ``max(delay, max_backoff_s)`` (False: announce
        again). Acknowledgements of our other announcements say the coordinator is working
        through a queue of them (64 steps announced at once took it over a second to
        acknowledge, and each one announced again after 1 s cost it more work); when they
        stop and ours still has no word, it was lost."""
        if self._ack_s is not None:  # not sooner than twice what acknowledgements take
            delay = max(delay, min(2 * self._ack_s, self.max_backoff_s))
        sent = time.monotonic()
        latest = sent + max(delay, self.max_backoff_s)
        while True:
            quiet = max(sent, self._acked_at or sent) + delay
            left = min(quiet, latest) - time.monotonic()
            if left <= 0:
                return False
            if await self._wait(moved, left, deadline, step):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _verdict_of(self, outcome: Outcome, round_: int, step: str) -> bool:
        """True if the round/5 record's ``outcome`` of ``step`` aggregated this peer's input;
        else the RefusedError saying why not (its exclusion, the step's failure, or left out)."""
        assert self.key is not None and outcome.known
        did, job, result = self.key.did, self.config.job, outcome.result
        if result is not None and self.config.roster.has(outcome.peers, did):
            return True
        why = dict(outcome.excluded).get(did)
        if why is not None:
            raise RefusedError.parse(why, peer=did, round_=round_, job=job, step=step)
        if result is None:
            failed = f"step {step!r} of round {round_} failed: {outcome.failed}"
            raise _refusal(Standing.FAILED, failed, job, round_, did, step)
        over = f"step {step!r} of round {round_} closed without this peer's input"
        raise _refusal(Standing.OVER, over, job, round_, did, step)


def _refusal(
    where: Standing, reason: str | None, job: str, round_: int, peer: str, step: str | None
) -> RefusedError:
    """What a peer raises when its coordinator's statuses say its input will not be aggregated:
    the status's own refusal (its code read, ``UNKNOWN`` if this version does not know it),
    or the peer's reading that the round (or its step) failed or ended without it."""
    if where is Standing.REFUSED:
        return RefusedError.parse(
            reason or Reason.REFUSED, peer=peer, round_=round_, job=job, step=step
        )
    code = Reason.ROUND_FAILED if where is Standing.FAILED else Reason.ROUND_OVER
    text = reason or ("failed" if where is Standing.FAILED else "round over")
    detail = reason_detail(text) or text
    return RefusedError(code, detail, reason=text, peer=peer, round_=round_, job=job, step=step)
