"""The coordinator: an asyncio service driven by announcements, fetch completions and deadlines.

For each announcement it checks signature, job, allowlist, round and duplicates,
journals it, then resolves and verifies the CID through its node, decodes with the
job's limits, and checks schema and finiteness.  A round closes when every expected
peer is settled or at its deadline with a quorum; the aggregate, the signed round
record and the result message are published in that order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..aggregate import aggregate_with_info, prepare
from ..dag import CID
from ..dag.cid import DAG_CBOR
from ..errors import (
    AggregationError,
    CoordinatorError,
    DAGError,
    FormatError,
    IntegrityError,
    LimitExceededError,
    MessageError,
    NodeError,
)
from ..format import Gradient
from ..job import JobConfig
from ..messages import (
    Announce,
    RecordExclusion,
    RecordInput,
    Result,
    RoundRecord,
    SigningKey,
    Status,
    aggregate_meta,
    decode_record,
    encode_message,
    encode_record,
    verify_message,
)
from ..node import Node, PubsubMessage, follow
from ..store import GradientStore
from .journal import Journal
from .slots import PeerSlot, PeerState, schema_of

log = logging.getLogger("gradstore.coordinator")

Schema = tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class RoundOutcome:
    """How one round ended: closed with an aggregate and record, or failed with a reason."""

    round: int
    status: str  # "closed" | "failed"
    output: CID | None
    record: CID | None
    peers: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...]
    reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)


class Coordinator:
    """Runs the rounds of one job over one node."""

    def __init__(
        self,
        config: JobConfig,
        key: SigningKey,
        node: Node,
        state_dir: str | Path,
        *,
        fetch_concurrency: int = 4,
        rebroadcast_s: float = 2.0,
        linger_s: float = 3.0,
        on_round: Callable[[RoundOutcome], None] | None = None,
    ) -> None:
        if key.did != config.coordinator:
            raise CoordinatorError(
                f"the key's id {key.did} is not the job's coordinator {config.coordinator}"
            )
        self.config = config
        self.key = key
        self.node = node
        self.state_dir = Path(state_dir)
        self.store = GradientStore(node, limits=config.limits)
        self.rebroadcast_s = rebroadcast_s
        self.linger_s = linger_s
        self.on_round = on_round
        self.outcomes: list[RoundOutcome] = []
        self.refusals: list[tuple[str, str]] = []  # (reason, detail), for logs and tests
        self.round = 0
        self.head: CID | None = None
        self._sem = asyncio.Semaphore(fetch_concurrency)
        self._slots: dict[str, PeerSlot] = {}
        self._opened_at = 0.0
        self._changed = asyncio.Event()
        self._last_result: bytes | None = None
        self._last_failure: bytes | None = None  # the last failed round's status, re-broadcast
        self._journal: Journal | None = None
        self._bytes_fetched = 0
        self._fetch_seconds = 0.0
        self._prepared: asyncio.Task[None] | None = None

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            raise CoordinatorError("coordinator is not running")
        return self._journal

    # -- lifecycle ------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> list[RoundOutcome]:
        """Run rounds until ``rounds.count`` are done (or ``stop`` is set); return their outcomes."""
        stop = stop or asyncio.Event()
        self._journal = Journal(self.state_dir / "journal.sqlite")
        try:
            self.journal.bind(self.config.job, self.config.coordinator)
            await self._recover()
            async with self.node.subscribe(self.config.gradients_topic) as sub:
                reader = asyncio.create_task(self._read(sub), name="coordinator-reader")
                beacon = asyncio.create_task(self._rebroadcast(), name="coordinator-rebroadcast")
                try:
                    await self._rounds(stop)
                    if not stop.is_set() and self.linger_s > 0:
                        await _wait(stop, self.linger_s)  # let late peers see the last result
                finally:
                    fetches = [s.task for s in self._slots.values() if s.task]
                    for task in (reader, beacon, *fetches):
                        task.cancel()
                    await asyncio.gather(reader, beacon, return_exceptions=True)
                    if self._prepared is not None:  # a thread: let it finish rather than leak it
                        await self._prepared
        finally:
            self.journal.close()
            self._journal = None
        return self.outcomes

    async def _recover(self) -> None:
        """Resume from the journal: head record, current round, unpublished results."""
        rows = self.journal.rounds()
        closed = [row for row in rows if row.state == "closed" and row.record]
        for row in closed:
            self.head = CID.parse(row.record or "")
            if not row.published or row is closed[-1]:  # the last one is re-broadcast too
                record = decode_record(await self.node.get_block(self.head), cid=self.head)
                await self._publish_result(row.round, record, self.head)
                self.journal.mark_published(row.round)
        failed = [r for r in rows if r.state == "failed"]
        if failed:  # late peers of the last failed round still learn why
            last = failed[-1]
            self._last_failure = self._status(last.round, failed=last.reason or "failed")
        open_rows = [r for r in rows if r.state == "open"]
        if open_rows:
            self.round = open_rows[0].round
        elif rows:
            self.round = rows[-1].round + 1
        if rows:
            log.info(
                "resuming job %s at round %d (head record %s)",
                self.config.job,
                self.round,
                self.head,
            )

    async def _rounds(self, stop: asyncio.Event) -> None:
        count = self.config.rounds.count
        while (count == 0 or self.round < count) and not stop.is_set():
            self._open(self.round)
            closing = await self._wait_for_close(stop)
            if not closing:
                return  # stopped: the round stays open in the journal
            outcome = await self._close(self.round)
            self.journal.set_stats(self.round, outcome.stats)
            self.outcomes.append(outcome)
            log.info("%s", format_outcome(outcome))
            if self.on_round is not None:
                self.on_round(outcome)
            self.round += 1

    def _open(self, round_: int) -> None:
        row = self.journal.open_round(round_)
        self._opened_at = row.opened_at
        self._slots = {p: PeerSlot(p) for p in self.config.peers}
        self._bytes_fetched = 0
        self._fetch_seconds = 0.0
        for inp in self.journal.inputs(round_):
            slot = self._slots.get(inp.peer)
            if slot is None:
                continue
            slot.cid, slot.num_samples = inp.cid, inp.num_samples
            if inp.state == PeerState.FAILED:
                slot.fail(inp.reason or "failed")
            else:
                self._start_fetch(round_, slot)
        log.info(
            "round %d open: %d/%d peers already announced",
            round_,
            sum(s.state != PeerState.PENDING for s in self._slots.values()),
            len(self._slots),
        )

    async def _wait_for_close(self, stop: asyncio.Event) -> bool:
        deadline = self._opened_at + self.config.rounds.deadline_s
        while not stop.is_set():
            self._changed.clear()
            if all(s.settled for s in self._slots.values()):
                return True
            remaining = deadline - time.time()
            if remaining <= 0:
                return True
            waiter = asyncio.create_task(self._changed.wait())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait(
                {waiter, stopper}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            stopper.cancel()
        return False

    # -- announcements ------------------------------------------------------
    async def _read(self, sub: Any) -> None:
        async for msg in follow(self.node, sub):
            try:
                await self._on_message(msg)
            except Exception:  # one bad message must never stop the service
                log.exception("error handling a message from %s", getattr(msg, "from_peer", "?"))

    def _refuse(self, reason: str, detail: str) -> None:
        self.refusals.append((reason, detail))
        if reason == "duplicate":  # peers re-announce until acknowledged: expected, not alarming
            log.debug("ignored announcement: %s: %s", reason, detail)
        else:
            log.warning("refused announcement: %s: %s", reason, detail)

    async def _on_message(self, msg: PubsubMessage) -> None:
        cfg = self.config
        try:
            ann = verify_message(
                msg.data, job=cfg.job, coordinator=cfg.coordinator, peers=cfg.peers
            )
        except MessageError as exc:
            self._refuse(exc.reason, f"{exc} (from node {msg.from_peer})")
            return
        if not isinstance(ann, Announce):
            self._refuse("unexpected-type", f"{type(ann).__name__} on the gradients topic")
            return
        r = ann.round
        if r < self.round:
            self._refuse(
                "stale-round", f"{ann.peer} announced round {r}; round {self.round} is open"
            )
            return
        if r > self.round + cfg.rounds.max_ahead:
            self._refuse(
                "future-round", f"{ann.peer} announced round {r}; round {self.round} is open"
            )
            return
        existing = self.journal.input(r, ann.peer)
        if existing is not None:
            if existing.cid == ann.cid:  # a re-announcement: answer it, count nothing twice
                self._refuse("duplicate", f"{ann.peer} already announced {ann.cid} for round {r}")
                await self._publish_status(r)
            else:
                self._refuse(
                    "conflicting-cid", f"{ann.peer} already announced {existing.cid} for round {r}"
                )
            return
        try:
            CID.parse(ann.cid)
        except ValueError as exc:
            self._refuse("malformed", f"bad CID from {ann.peer}: {exc}")
            return
        self.journal.accept(
            r, ann.peer, ann.cid, ann.num_samples, msg.data
        )  # durable before acting
        log.info("round %d: %s announced %s (%d samples)", r, ann.peer, ann.cid, ann.num_samples)
        if r == self.round:
            slot = self._slots[ann.peer]
            slot.cid, slot.num_samples = ann.cid, ann.num_samples
            self._start_fetch(r, slot)
            self._changed.set()
        await self._publish_status(r)

    # -- fetch and verify ---------------------------------------------------
    def _start_fetch(self, round_: int, slot: PeerSlot) -> None:
        slot.state = PeerState.RECEIVED
        slot.task = asyncio.create_task(self._fetch(round_, slot), name=f"fetch-{slot.peer[-8:]}")

    async def _fetch(self, round_: int, slot: PeerSlot) -> None:
        assert slot.cid is not None
        reason: str | None = None
        gradient: Gradient | None = None
        async with self._sem:
            start = time.perf_counter()
            delay = 0.5
            while True:
                try:
                    gradient = await self.store.get(slot.cid)
                    reason = await asyncio.to_thread(_check, gradient, self._known_schema())
                    break
                except IntegrityError as exc:
                    reason = f"integrity: {exc}"
                except LimitExceededError as exc:
                    reason = f"too-large: {exc}"
                except (FormatError, DAGError) as exc:
                    reason = f"malformed: {exc}"
                except NodeError as exc:  # not reachable yet: retry until the deadline
                    if time.time() + delay < self._opened_at + self.config.rounds.deadline_s:
                        log.debug(
                            "round %d: fetching %s failed (%s), retrying", round_, slot.cid, exc
                        )
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 5.0)
                        continue
                    reason = f"unavailable: {exc}"
                except Exception as exc:  # a bug must fail this input, not hang the round
                    log.exception(
                        "round %d: fetching %s from %s crashed", round_, slot.cid, slot.peer
                    )
                    reason = f"internal error: {type(exc).__name__}: {exc}"
                break
            self._fetch_seconds += time.perf_counter() - start
        if round_ != self.round or slot is not self._slots.get(slot.peer):
            return  # the round moved on while we fetched
        if reason is None and gradient is not None:
            slot.state, slot.gradient = PeerState.VERIFIED, gradient
            slot.nbytes = gradient.nbytes
            self._bytes_fetched += gradient.nbytes
            log.info("round %d: %s verified (%d bytes)", round_, slot.peer, gradient.nbytes)
            if self._prepared is None:  # load the aggregation kernel while the others arrive
                self._prepared = asyncio.create_task(_prepare(gradient), name="aggregate-prepare")
        else:
            slot.fail(reason or "failed")
            log.warning("round %d: %s failed: %s", round_, slot.peer, slot.reason)
        self.journal.set_input_state(round_, slot.peer, slot.state, slot.reason)
        self._changed.set()
        await self._publish_status(round_)

    def _known_schema(self) -> Schema | None:
        if self.config.schema is not None:
            return tuple((t.name, t.dtype, t.shape) for t in self.config.schema)
        learned = self.journal.get_meta("schema")
        if learned is None:
            return None
        return tuple((n, d, tuple(s)) for n, d, s in learned)

    # -- closing ------------------------------------------------------------
    async def _close(self, round_: int) -> RoundOutcome:
        t_close = time.perf_counter()
        slots = self._slots
        for slot in slots.values():
            if slot.state == PeerState.RECEIVED:
                if slot.task:
                    slot.task.cancel()
                slot.fail("not verified by the deadline")
                self.journal.set_input_state(round_, slot.peer, slot.state, slot.reason)
        if self._known_schema() is None:
            self._keep_majority_schema(round_)
        verified = sorted(p for p, s in slots.items() if s.state == PeerState.VERIFIED)
        excluded = tuple(
            (p, s.reason or "absent: never announced")
            for p, s in sorted(slots.items())
            if p not in verified
        )
        stats: dict[str, Any] = {
            "expected": len(slots),
            "received": sum(s.state != PeerState.PENDING for s in slots.values()),
            "verified": len(verified),
            "failed": sum(s.state == PeerState.FAILED for s in slots.values()),
            "bytes_fetched": self._bytes_fetched,
            "resolve_s": round(self._fetch_seconds, 3),
            "open_s": round(time.time() - self._opened_at, 3),
        }
        quorum = self.config.rounds.quorum
        if len(verified) < quorum:
            return await self._fail(
                round_,
                f"quorum not met: {len(verified)} verified of {quorum} needed",
                excluded,
                stats,
            )
        try:
            outcome = await self._aggregate_and_publish(round_, verified, excluded, stats, t_close)
        except AggregationError as exc:
            return await self._fail(round_, f"aggregation refused: {exc}", excluded, stats)
        for p in verified:
            slots[p].state = PeerState.AGGREGATED
            slots[p].gradient = None
            self.journal.set_input_state(round_, p, PeerState.AGGREGATED)
        return outcome

    def _keep_majority_schema(self, round_: int) -> None:
        """Without a configured or learned schema, inputs that disagree with the majority are excluded."""
        groups: dict[Schema, list[str]] = {}
        for p, s in sorted(self._slots.items()):
            if s.state == PeerState.VERIFIED and s.gradient is not None:
                groups.setdefault(schema_of(s.gradient), []).append(p)
        if len(groups) <= 1:
            return
        keep = max(groups.items(), key=lambda kv: (len(kv[1]), [-ord(c) for c in kv[1][0]]))[0]
        for schema, peers in groups.items():
            if schema != keep:
                for p in peers:
                    self._slots[p].fail(
                        f"schema-mismatch: disagrees with the majority ({_schema_text(keep)})"
                    )
                    self.journal.set_input_state(round_, p, PeerState.FAILED, self._slots[p].reason)

    async def _aggregate_and_publish(
        self,
        round_: int,
        verified: list[str],
        excluded: tuple[tuple[str, str], ...],
        stats: dict[str, Any],
        t_close: float,
    ) -> RoundOutcome:
        cfg = self.config
        slots = self._slots
        params = cfg.params_for(verified)
        inputs = [slots[p].gradient.tensors for p in verified]  # type: ignore[union-attr]
        samples = [slots[p].num_samples for p in verified]
        t0 = time.perf_counter()
        result, info = await asyncio.to_thread(aggregate_with_info, inputs, params, samples)
        stats["aggregate_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        cids = [CID.parse(slots[p].cid or "") for p in verified]
        meta = aggregate_meta(cfg.job, round_, cfg.method, cids)
        output = await self.store.put(Gradient(result, meta))
        # the factor each input was multiplied by; 1.0 for order statistics (median, trimmed mean)
        weights = info.weights or tuple(1.0 for _ in verified)
        record = RoundRecord(
            job=cfg.job,
            round=round_,
            method=cfg.method,
            params=params.to_record(),
            inputs=tuple(
                RecordInput(p, c, slots[p].num_samples, float(w))
                for p, c, w in zip(verified, cids, weights, strict=True)
            ),
            excluded=tuple(
                RecordExclusion(p, why, _maybe_cid(slots[p].cid)) for p, why in excluded
            ),
            output=output,
            prev=self.head,
            coordinator=cfg.coordinator,
        )
        record_cid, record_bytes = encode_record(record, self.key)
        stored = await self.node.put_block(record_bytes, DAG_CBOR)
        if stored != record_cid:
            raise NodeError(f"node stored the round record as {stored}, expected {record_cid}")
        await self.node.pin(record_cid)  # keeps the whole round: inputs, output, record
        if self.journal.get_meta("schema") is None and cfg.schema is None:
            first = slots[verified[0]].gradient
            assert first is not None
            self.journal.set_meta("schema", [[n, d, list(s)] for n, d, s in schema_of(first)])
        self.journal.close_round(round_, str(output), str(record_cid))  # durable before announcing
        self.head = record_cid
        await self._publish_result(round_, record, record_cid)
        self.journal.mark_published(round_)
        stats["publish_s"] = round(time.perf_counter() - t0, 3)
        stats["close_s"] = round(time.perf_counter() - t_close, 3)
        return RoundOutcome(
            round_, "closed", output, record_cid, tuple(verified), excluded, None, stats
        )

    async def _fail(
        self, round_: int, reason: str, excluded: tuple[tuple[str, str], ...], stats: dict[str, Any]
    ) -> RoundOutcome:
        self.journal.fail_round(round_, reason)
        self._last_failure = self._status(round_, failed=reason)
        await self._publish(self._last_failure)
        return RoundOutcome(round_, "failed", None, None, (), excluded, reason, stats)

    # -- publishing -----------------------------------------------------------
    async def _publish_result(self, round_: int, record: RoundRecord, record_cid: CID) -> None:
        msg = Result(
            job=self.config.job,
            round=round_,
            cid=str(record.output),
            record=str(record_cid),
            method=record.method,
            peers=tuple(sorted(i.peer for i in record.inputs)),
            sent_at=_now_ms(),
        )
        self._last_result = encode_message(msg, self.key)
        await self._publish(self._last_result)

    def _status(self, round_: int, *, failed: str | None = None) -> bytes:
        received = tuple(sorted(row.peer for row in self.journal.inputs(round_)))
        status = Status(
            job=self.config.job, round=round_, received=received, sent_at=_now_ms(), failed=failed
        )
        return encode_message(status, self.key)

    async def _publish_status(self, round_: int) -> None:
        await self._publish(self._status(round_))

    async def _publish(self, data: bytes) -> None:
        try:
            await self.node.publish(self.config.results_topic, data)
        except NodeError as exc:  # peers re-announce and we re-broadcast: never fatal
            log.warning("publishing on %s failed: %s", self.config.results_topic, exc)

    async def _rebroadcast(self) -> None:
        """Pubsub may drop messages: repeat the open round's status, the last result and failure."""
        while True:
            await asyncio.sleep(self.rebroadcast_s)
            if self._journal is None:
                return
            if self.journal.inputs(self.round):
                await self._publish_status(self.round)
            for last in (self._last_result, self._last_failure):
                if last is not None:
                    await self._publish(last)


def _check(gradient: Gradient, expected: Schema | None) -> str | None:
    """Why ``gradient`` cannot enter the round (schema, NaN/Inf), or None. Runs off the loop."""
    if expected is not None and schema_of(gradient) != expected:
        got = _schema_text(schema_of(gradient))
        return f"schema-mismatch: expected {_schema_text(expected)}, got {got}"
    for name, arr in gradient.tensors.items():
        if arr.dtype.kind == "f" and not bool(np.isfinite(arr).all()):
            return f"non-finite: tensor {name!r} holds NaN or Inf"
    return None


def format_outcome(outcome: RoundOutcome) -> str:
    """The one-line summary of a round printed by the CLI and logged."""
    s = outcome.stats
    counts = f"{s.get('verified', 0)}/{s.get('expected', 0)} verified"
    if outcome.status == "failed":
        return f"round {outcome.round} failed: {outcome.reason} ({counts})"
    return (
        f"round {outcome.round} closed: {len(outcome.peers)} peers ({counts}), "
        f"aggregate {outcome.output} record {outcome.record}, "
        f"{s.get('bytes_fetched', 0) / 1e6:.1f} MB fetched in {s.get('resolve_s', 0):.2f}s, "
        f"aggregate {s.get('aggregate_s', 0):.2f}s, publish {s.get('publish_s', 0):.2f}s"
    )


def _maybe_cid(value: str | None) -> CID | None:
    return None if value is None else CID.parse(value)


def _schema_text(schema: Schema) -> str:
    return ", ".join(f"{n}:{d}{list(s)}" for n, d, s in schema)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


async def _prepare(gradient: Gradient) -> None:
    """Get the aggregators' compiled kernel ready for inputs like ``gradient``, off the loop."""
    try:
        ready = await asyncio.to_thread(prepare, gradient.tensors)
    except Exception:  # the aggregate stage would meet the same problem and report it
        log.exception("preparing the aggregation kernel failed")
    else:
        log.debug("aggregation kernel: %s", "numba" if ready else "NumPy")
