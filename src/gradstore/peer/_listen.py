"""Hearing a job's coordinator: its signed statuses and results on the job's results topic,
verified, checked for freshness and kept in a ``CoordinatorView``; and waiting on them.

Anyone can publish on the topic, so every message is verified against the job's
coordinator key (a step another coordinator owns: that owner's, docs/design/multicoord.md)
and roster, and junk is logged once per reason. Many peers in one process
may share one subscription (``listener``): its messages are decoded and verified once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final, Self

from ..dag import CID
from ..errors import CoordinatorError, MessageError, NodeError, Reason
from ..job import JobConfig
from ..messages import PeerLists, Result, Status, decode_lists, inline_lists, verify_message
from ..messages.refusal_log import RefusalLog
from ..node import Node, follow
from ._news import EVERY, News
from ._view import CoordinatorView
from ._waiting import RoundWait, round_wait

log = logging.getLogger("gradstore.peer")

#: How long a peer waits for a word from its coordinator before saying it is not there.
DEFAULT_COORDINATOR_TIMEOUT_S: Final = 15.0

#: Lists blocks a peer keeps (by CID), so a repeated status costs no fetch.
_LISTS_CACHE: Final = 16


class CoordinatorListener:
    """What one node hears from a job's coordinator. Use as ``async with``.

    With ``listener`` (another, entered one) it hears the coordinator through that one's
    subscription instead of its own. With ``partials`` (``config`` a tree job's group view)
    it hears the group's leaf alone, its own (partial) results included, and skips the
    root's messages: what ``gradstore round status`` shows of a group; a peer takes the
    round's result from the root instead.
    """

    def __init__(
        self,
        config: JobConfig,
        node: Node,
        *,
        coordinator_timeout_s: float = DEFAULT_COORDINATOR_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        listener: CoordinatorListener | None = None,
        partials: bool = False,
    ) -> None:
        if partials and config.root is None:
            raise CoordinatorError("only a tree job's group view (its leaf) has partial results")
        self.config = config
        self.partials = partials
        self.node = node
        self.coordinator_timeout_s = coordinator_timeout_s
        self.clock = clock
        steps = [s.name for s in config.steps] if config.stepped else []
        self.view = CoordinatorView(config.roster, steps)
        self._heard_at: float | None = None  # monotonic time of the last fresh coordinator message
        self._started_at = 0.0
        self._listening_since_ms = 0
        self._skew_warned = False
        # junk on the results topic: a line per reason, then sums
        self._ignored = RefusalLog(verb="ignored")
        self._lists: dict[str, PeerLists] = {}
        self._news = News()
        self._sub: object = None
        self._reader: asyncio.Task[None] | None = None
        self._listener = listener

    async def __aenter__(self) -> Self:
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

    async def next_message(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the coordinator's next verified, fresh status
        or result (now in ``view``); whether one came."""
        try:
            async with asyncio.timeout(timeout):  # in this task: see ``_wait``
                await self._news.wait()
        except TimeoutError:
            return False
        return True

    async def _read(self, sub: object) -> None:
        cfg = self.config
        async for msg in follow(self.node, sub):  # type: ignore[arg-type]
            summary = self._ignored.summary(time.monotonic())
            if summary is not None:
                log.warning("on %s: %s", cfg.results_topic, summary)
            try:
                parsed = verify_message(  # a step another coordinator owns: its owner signs
                    msg.data,
                    job=cfg.job,
                    coordinator=cfg.coordinator,
                    peers=cfg.roster,
                    owners=cfg.step_owners,
                    results_by=None if self.partials else cfg.root,  # a tree's: the root's
                )
            except MessageError as exc:  # anyone can publish here: no sender to name
                if self.partials and _signed_by_root(msg.data, cfg):
                    continue  # the round's result, or its failure: the leaf's word is wanted
                tree = None if cfg.root is None else _from_tree(msg.data, cfg)
                if tree is True:
                    continue  # a tree's leaf's partial result, there for the root: not ours
                if isinstance(tree, Status):
                    parsed = tree  # the tree's root says the round failed
                elif self._ignored.refused(exc.reason, None, time.monotonic()):
                    log.warning(
                        "ignored a message on %s: %s (repeats are summed up every %.0f s)",
                        cfg.results_topic,
                        exc,
                        self._ignored.every_s,
                    )
                if not isinstance(tree, Status):
                    continue
            if not isinstance(parsed, Status | Result):
                continue
            if not self._fresh(parsed.sent_at):
                continue
            if not self.view.knows(parsed.step):  # signed, but about no step of this job
                if self._ignored.refused(Reason.UNKNOWN_STEP, None, time.monotonic()):
                    log.warning(
                        "ignored a %s about step %r, which job %s does not have",
                        parsed.kind.value,
                        parsed.step,
                        cfg.job,
                    )
                continue
            try:
                lists = await self._lists_of(parsed)
            except (MessageError, NodeError, TimeoutError) as exc:
                log.warning("ignored a %s whose lists cannot be read: %s", parsed.kind.value, exc)
                continue
            before = self.view.current, self.view.open_round
            if isinstance(parsed, Status):
                self.view.see_status(parsed, lists)
            else:
                self.view.see_result(parsed, lists)
            self._heard_at = time.monotonic()
            # a step's message concerns that step's waiters; the round's own, a new run's
            # or one that opens a round, every waiter
            moved = (self.view.current, self.view.open_round) != before
            self._news.about(parsed.step, everyone=parsed.step is None or moved)

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

    def silent_for(self) -> float:
        """Seconds since the coordinator was last heard (or since we started listening)."""
        hub = self._listener or self
        return time.monotonic() - (hub._heard_at or hub._started_at)

    @property
    def heard(self) -> bool:
        """Whether the coordinator has been heard (a fresh message it signed) since we listen."""
        hub = self._listener or self
        return hub._heard_at is not None

    def round_wait(self, round_: int, step: str | None = None) -> RoundWait | None:
        """Where ``round_`` (its ``step``; a stepped round whole without one) stands, as the
        coordinator's statuses stamped since we began to listen say: what a waiting peer
        shows. None until a status of it is heard."""
        return round_wait(self.view, self.config, round_, step, self._listening_since_ms)

    def _no_coordinator(self) -> CoordinatorError:
        cfg = self.config
        hub = self._listener or self
        heard = "has not been heard" if hub._heard_at is None else "has been silent"
        return CoordinatorError(
            f"the coordinator of job {cfg.job} {heard} for {self.silent_for():.0f} s "
            f"on {cfg.results_topic} (is `gradstore coordinator` running, and connected to "
            "this node?)"
        )

    async def _wait(
        self,
        ready: Callable[[], bool],
        step: float | None,
        deadline: float | None,
        about: str | None = None,
    ) -> bool:
        """Wait until ``ready()``, ``step`` seconds from now, the deadline, or coordinator silence.

        True when ready; raises the "no coordinator" error once the coordinator has been
        silent for ``coordinator_timeout_s``. Messages that leave ``ready()`` false wake the
        wait but do not restart ``step``: the coordinator repeats itself every few seconds.
        With ``about`` (a step's name, when ``ready()`` reads that step alone and the
        round's own messages), other steps' messages do not wake it (``_news``).
        """
        until = deadline
        if step is not None:
            stop = time.monotonic() + step
            until = stop if deadline is None else min(deadline, stop)
        while True:
            if ready():
                return True
            silent_left = self.coordinator_timeout_s - self.silent_for()
            if silent_left <= 0:
                raise self._no_coordinator()
            limit = silent_left if until is None else min(silent_left, until - time.monotonic())
            if limit <= 0:
                return False
            # the wait runs in this task (not ``wait_for``'s task of its own, which on
            # Python 3.11 could outlive a cancelled waiter: the steps benchmark hung there)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit):
                    await self._news.wait(EVERY if about is None else about)


def _signed_by_root(data: bytes, cfg: JobConfig) -> bool:
    """Whether ``data`` is a message of ``cfg``'s job signed by its tree's root."""
    assert cfg.root is not None
    try:
        verify_message(data, job=cfg.job, coordinator=cfg.root, peers=cfg.roster)
    except MessageError:
        return False
    return True


def _from_tree(data: bytes, cfg: JobConfig) -> bool | Status:
    """In a tree job's group view, a message its leaf's statuses and the root's results
    are not: True for the leaf's own (partial) result, the root's status if it says the
    round failed (with no step), else False."""
    try:
        msg = verify_message(data, job=cfg.job, coordinator=cfg.coordinator)
    except MessageError:
        pass
    else:
        return isinstance(msg, Result)
    assert cfg.root is not None
    try:
        msg = verify_message(data, job=cfg.job, coordinator=cfg.root, peers=cfg.roster)
    except MessageError:
        return False
    if isinstance(msg, Status) and msg.failed is not None and msg.step is None:
        return msg
    return False
