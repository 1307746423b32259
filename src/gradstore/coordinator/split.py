"""A round split among coordinators by steps (docs/design/multicoord.md): the part of
``Coordinator`` that hears the other coordinators.

An owner that is not the job's coordinator (the root) adopts the root's run before its
first round and, after its last, keeps answering its steps' peers until the root's result
is heard; the root reads the other owners' signed step results, checks the step records
they name (``remote.check_remote_step``) and closes those steps with them. The decisions
(which steps are due, failed or closed) are ``CoordinatorState``'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..dag import CID
from ..errors import ConfigError, CoordinatorError, IntegrityError, MessageError, NodeError
from ..job import JobConfig, topics
from ..messages import Result, Status, decode_step_record, verify_message
from ..node import Node, follow
from ._tasks import until
from .closer import Closer
from .journal import Journal
from .remote import check_remote_step

log = logging.getLogger("gradstore.coordinator")


def check_owner(config: JobConfig, did: str) -> None:
    """Refuse (ConfigError) a coordinator key ``did`` that owns nothing of ``config``'s
    rounds, and a split job whose root owns no step (its statuses give the others the run)."""
    if did not in config.coordinators:
        raise ConfigError(
            f"the key's id {did} is not the job's coordinator {config.coordinator}"
            + (
                ""
                if len(config.coordinators) == 1
                else " nor the owner of any of its steps ([[steps]] coordinator)"
            )
        )
    if len(config.coordinators) > 1 and not config.steps_of(config.coordinator):
        raise ConfigError(  # its statuses are how the other owners learn the run
            f"job {config.job!r}: its coordinator {config.coordinator} owns no step; "
            "a job split among coordinators leaves at least one step to its coordinator "
            "(docs/design/multicoord.md)"
        )


class SplitSteps(Closer):
    """Hears the other coordinators of a split job for ``Coordinator`` (which has every
    attribute named here); a job with one coordinator returns at once from each."""

    resolve_timeout_s: float
    _remote_reads: set[tuple[int, str]]
    _root_news: asyncio.Event
    _tg: asyncio.TaskGroup | None

    async def _bind(self, journal: Journal, stop: asyncio.Event) -> str:
        """The run id: the journal's (drawn on first use); at an owner that is not the root,
        the root's, heard from its signed status first ("" if ``stop`` came before)."""
        run = journal.bind(self.config.job, self.key.did)
        if self.state.steps.root and self.config.root is None:  # not a tree's leaf
            return run
        adopted = await adopt_run(self.node, self.config, stop, self.clock)
        if adopted is None:
            return ""
        if adopted != run:
            if journal.rounds():
                raise CoordinatorError(
                    f"state {journal.path} holds run {run}, but the job's coordinator "
                    f"{self.config.coordinator} runs {adopted}: use another --state"
                )
            journal.set_meta("run", adopted)
        log.info("run %s, the job's coordinator's (it combines the parts)", adopted)
        return adopted

    async def _remote(self) -> None:
        """In a job split among coordinators, hear the others on the results topic: at the
        root, the other owners' signed step results and failures
        (``remote.check_remote_step``); at another owner, the root's round results, after
        which its steps of that round are no longer repeated (``root_heard``)."""
        if self.config.root is not None:  # a tree's leaf: the root's result on our topic
            await self._hear_root()
            return
        if not self.state.steps.others:
            return
        cfg = self.config
        async with self.node.subscribe(cfg.results_topic) as sub:
            async for msg in follow(self.node, sub):
                try:
                    parsed = verify_message(
                        msg.data,
                        job=cfg.job,
                        coordinator=cfg.coordinator,
                        peers=cfg.roster,
                        owners=cfg.step_owners,
                    )
                except MessageError:
                    continue  # anyone may publish there; a peer's listener logs junk
                if not isinstance(parsed, Result | Status) or parsed.run != self.state.run_id:
                    continue
                if not self.state.steps.root:
                    if parsed.step is None and (isinstance(parsed, Result) or parsed.failed):
                        self.state.root_heard(parsed.round)  # the round is over at the root
                        self._root_news.set()
                    continue
                if parsed.step is None:
                    continue
                if not self.state.wants_remote(parsed.round, parsed.step):
                    continue
                if isinstance(parsed, Status):
                    if parsed.failed is not None:
                        self._apply(
                            self.state.remote_failed(parsed.round, parsed.step, parsed.failed)
                        )
                    continue
                at = (parsed.round, parsed.step)
                if at not in self._remote_reads and self._tg is not None:
                    self._remote_reads.add(at)
                    self._tg.create_task(self._read_remote(parsed), name="coordinator-remote")

    async def _hear_root(self) -> None:
        """At a tree's leaf (docs/design/multicoord.md): the root's round results on the
        group's results topic (``root_heard``), which end its wait after its last round."""
        cfg = self.config
        async with self.node.subscribe(cfg.results_topic) as sub:
            async for msg in follow(self.node, sub):
                try:  # a result passes only signed by the root (our own do not)
                    parsed = verify_message(
                        msg.data,
                        job=cfg.job,
                        coordinator=cfg.coordinator,
                        peers=cfg.roster,
                        results_by=cfg.root,
                    )
                except MessageError:
                    continue
                if isinstance(parsed, Result) and parsed.run == self.state.run_id:
                    self.state.root_heard(parsed.round)
                    self._root_news.set()

    async def _until_root(self, stop: asyncio.Event) -> None:
        """At an owner that is not the root (or a tree's leaf), after its last round: keep
        answering its peers until the root's result (or failure) of that round is heard, at most
        the job's longest step deadline plus the close retries (the root's own bound)."""
        last = self.state.round - 1
        if (self.state.steps.root and self.config.root is None) or last < 0:
            return
        bound = max(s.deadline_s for s in self.config.steps) + self.close_retry_s
        end = self.clock() + bound
        while self.state.root_round < last and not stop.is_set() and self.clock() < end:
            self._root_news.clear()
            await until(self._root_news, min(1.0, end - self.clock()))
        if self.state.root_round < last:
            log.warning("round %d: no result from the job's coordinator; stopping anyway", last)

    async def _read_remote(self, result: Result) -> None:
        """Fetch and check the step record another owner's ``result`` names; the step is
        closed here once it holds (else its owner's next repeat tries again)."""
        assert result.step is not None
        owner = self.state.steps.others[result.step]
        try:
            cid = CID.parse(result.record)
            data = await asyncio.wait_for(self.node.get_block(cid), self.resolve_timeout_s)
            record = decode_step_record(data, cid=cid)
            check_remote_step(
                result, cid, record, owner=owner, job=self.config.job, run=self.state.run_id
            )
        except (MessageError, IntegrityError, NodeError, TimeoutError) as exc:
            log.warning(
                "round %d step %s: the result of %s is not taken: %s",
                result.round,
                result.step,
                owner,
                exc,
            )
        else:
            if self.state.wants_remote(result.round, result.step):
                self._apply(self.state.remote_closed(record, cid))
        finally:
            self._remote_reads.discard((result.round, result.step))


async def adopt_run(
    node: Node, config: JobConfig, stop: asyncio.Event, clock: Callable[[], float]
) -> str | None:
    """The run id of the job's coordinator (the root), from its next signed, fresh status
    or result on the job's results topic (docs/design/multicoord.md: one run per job run,
    the root's; a tree's leaf, whose ``config`` is its group's view, hears its ``root``
    there); None if ``stop`` is set first."""
    skew_ms = config.messages.max_clock_skew_s * 1000
    root = config.root or config.coordinator
    log.info("waiting for the run of the job's coordinator %s", root)
    async with node.subscribe(topics(config.job)[1]) as sub:
        heard = asyncio.ensure_future(_first_run(node, sub, config, skew_ms, clock))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((heard, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (heard, stopped):
                task.cancel()
            await asyncio.gather(heard, stopped, return_exceptions=True)
        return heard.result() if heard.done() and not heard.cancelled() else None


async def _first_run(
    node: Node, sub: Any, config: JobConfig, skew_ms: float, clock: Callable[[], float]
) -> str:
    root = config.root or config.coordinator
    async for msg in follow(node, sub):
        try:  # no owners: only the root's own signature passes
            parsed = verify_message(msg.data, job=config.job, coordinator=root)
        except MessageError:
            continue
        if isinstance(parsed, Status | Result) and abs(parsed.sent_at - clock() * 1000) <= skew_ms:
            return parsed.run
    raise CoordinatorError(f"the subscription to {topics(config.job)[1]} ended")
