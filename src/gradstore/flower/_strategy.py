"""A Flower strategy whose train rounds are gradstore rounds: documents, a deterministic
aggregate and a signed round record that the audit tools verify like any other.

The inner Flower strategy (FedAvg by default) picks the clients, builds the instructions,
aggregates the metrics and runs evaluation; gradstore takes the arrays. Every reply
becomes a verified gradstore/1 document (put from the arrays it carried, or fetched by
the CID it announced, every block hashed), the documents are aggregated in peer order
with the coordinator's own round kernel (``gradstore.coordinator``: each input is verified
by ``verify_input`` or ``verify_gradient``, the round closed by ``close_round``: the aggregate
is stored and pinned, the record signed, stored and pinned the same way), and Flower gets
the aggregate read back from the record's output CID, with the record's CID in the
round's metrics. A reply that fails a check is excluded with its reason; the round goes on.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from logging import INFO, WARNING
from typing import Any, Final, Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Strategy

from ..coordinator import (
    FETCH_RETRY,
    ByteBudget,
    Claim,
    Schema,
    VerifiedInput,
    close_round,
    duplicates,
    new_run_id,
    verify_gradient,
    verify_input,
)
from ..coordinator import tensor_infos as tensor_infos  # its former home (tests import it here)
from ..dag import CID
from ..errors import (
    AggregationError,
    ConfigError,
    GradstoreError,
    NodeError,
    Reason,
    RefusedError,
)
from ..format import Gradient, dtype_code
from ..job import JobConfig, refuse_steps
from ..messages import Announce, SigningKey, announcement_signature, encode_message
from ..messages.schema import check_job
from ..node import Closing
from ..store import GradientStore
from ._arrays import arrays_to_tensors, tensors_to_arrays
from ._inner import check_inner
from ._job import job_config
from ._loop import NodeLoop, NodeSource
from ._protocol import (
    CONFIG_KEY,
    EXCLUDED_METRIC,
    INPUTS_METRIC,
    RECORD_METRIC,
    Instruction,
    cid_metric,
    custodial_did,
    custodial_key,
    model_meta,
    reply_meta,
)
from ._replies import Candidate, ReplyRules, read_reply

#: A reason longer than this is cut (a client's error text can be anything).
MAX_REASON_CHARS: Final = 300
#: CID-mode inputs fetched at once.
FETCH_CONCURRENCY: Final = 4
#: Verified documents kept in memory for the aggregation (Flower's own FedAvg holds every
#: reply); inputs beyond it are read back from the node range by range, in O(model) memory.
DEFAULT_KEEP_BYTES: Final = 1 << 30


@dataclass(frozen=True)
class FlowerRound:
    """What one train round stored: its record, its output, who went in, who was refused."""

    round: int
    record: CID | None  # None: no input passed, nothing was aggregated
    output: CID | None
    inputs: tuple[tuple[str, CID], ...]  # (peer did, gradient CID), in aggregation order
    excluded: tuple[tuple[str, str], ...]  # (peer did, reason)
    flower_bytes: int  # bytes of arrays the replies carried through Flower's transport
    seconds: float
    stages: dict[str, float]  # verify_s, aggregate_s, store_s, read_back_s


class GradstoreStrategy(Strategy, Closing):
    """Wrap a Flower strategy (FedAvg when ``inner`` is None) so each train round is recorded.

    ``node``: the Kubo RPC URL (or a function making a ``Node``) where documents, aggregates
    and records are stored and pinned. ``key``: the coordinator's signing key (a fresh one
    when None; its did signs every record). ``config``: the job, as a gradstore job file
    states it (``load_job``): its name, its coordinator (``key``'s did), its ``peers`` (the
    dids allowed to contribute; none listed: any signed client, plus unsigned ones when
    ``allow_unsigned``), its ``[aggregation]`` (gradstore's method and parameters), its
    ``[limits]`` and its ``[inputs]``; its rounds are Flower's and its schema the global
    model's. Without ``config``, the keywords it replaces build one (``job="flower"``,
    ``method=``, ``trim_ratio=``, ..., ``peers=``, ``limits=``, ``require_bound_meta=``).
    ``model_via="ipfs"`` sends the global model by CID too (clients read it with
    ``GradstoreClient.model``), so Flower's messages carry no arrays either way.
    ``memory_bytes`` bounds the documents being verified at once and ``keep_bytes`` those
    kept in memory until the aggregation; the others are read back from the node.
    ``inner``'s own ``aggregate_train`` never runs, so a strategy that has one of its own
    (FedMedian, FedAdam, ...) is refused unless ``replace_aggregation`` (see ``_inner``).
    A document announced by CID must be the announcing client's: the keys of its meta
    (peer, round, job, run, num_samples) must agree with the announcement, and with
    ``[inputs] require_bound_meta`` it must name its peer, round and job; a CID another
    reply of the round already announced is refused (``duplicate-cid``; the first reply
    keeps it).
    """

    def __init__(
        self,
        inner: Strategy | None = None,
        *,
        node: NodeSource,
        key: SigningKey | None = None,
        config: JobConfig | None = None,
        allow_unsigned: bool = True,
        model_via: Literal["flower", "ipfs"] = "flower",
        resolve_timeout_s: float = 10.0,
        fetch_attempts: int = 3,
        memory_bytes: int = DEFAULT_KEEP_BYTES,
        keep_bytes: int = DEFAULT_KEEP_BYTES,
        replace_aggregation: bool = False,
        **keywords: Any,
    ) -> None:
        self.inner: Strategy = inner if inner is not None else FedAvg()
        check_inner(self.inner, replace_aggregation=replace_aggregation)
        if config is None:
            self.key = key if key is not None else SigningKey.generate()
            config = job_config(self.key.did, **keywords)
        elif keywords:
            raise TypeError(
                f"pass config or the keywords it replaces ({', '.join(sorted(keywords))}), not both"
            )
        elif key is None or key.did != config.coordinator:
            raise ConfigError(
                f"the job's coordinator is {config.coordinator}: pass its key (key=...)"
            )
        else:
            self.key = key
        refuse_steps(config, "GradstoreStrategy")
        self.job = check_job("job", config.job)
        self.run_id = new_run_id()
        self.peers = frozenset(config.peers) or None
        self.allow_unsigned = allow_unsigned
        if model_via not in ("flower", "ipfs"):
            raise ConfigError(f"model_via must be 'flower' or 'ipfs', got {model_via!r}")
        self.model_via = model_via
        self.limits = config.limits
        self.resolve_timeout_s = resolve_timeout_s
        self.fetch_attempts = max(1, fetch_attempts)
        self.require_bound_meta = config.inputs.require_bound_meta
        self.weighted_by_key: str = getattr(self.inner, "weighted_by_key", "num-examples")
        self._job = config
        self._job.params_for([])  # refuse a misplaced parameter now, not at round 1
        self.history: dict[int, FlowerRound] = {}
        self._secret = secrets.token_bytes(32)
        self._announced: dict[str, tuple[int, bytes]] = {}  # this round's, by peer
        self._prev: CID | None = None
        self._instructions: dict[int, Instruction] = {}
        self._order: list[str] = []
        self._schema: Schema | None = None
        self._node_dids: dict[int, str] = {}
        self._did_nodes: dict[str, int] = {}
        self._budget = ByteBudget(memory_bytes)
        self._keep = ByteBudget(keep_bytes)
        self._io = NodeLoop(node, limits=self.limits, name="gradstore-flower-strategy")

    # -- lifecycle -------------------------------------------------------------
    def close(self) -> None:
        """Close the node's connections (the strategy reopens them if used again)."""
        self._io.close()

    @property
    def records(self) -> dict[int, CID]:
        """The round record of every train round that aggregated, by round."""
        return {r: h.record for r, h in self.history.items() if h.record is not None}

    # -- Strategy ----------------------------------------------------------------
    def summary(self) -> None:
        self.inner.summary()
        log(INFO, "\t└──> gradstore:")
        log(INFO, "\t\t├── Job: %s, run %s", self.job, self.run_id)
        log(INFO, "\t\t├── Coordinator: %s", self.key.did)
        log(INFO, "\t\t└── Aggregation: %s", self._job.method)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._expect(arrays)
        messages = list(self.inner.configure_train(server_round, arrays, config, grid))
        instruction = self._instruct(messages, server_round, arrays)
        self._instructions[server_round] = instruction
        return messages

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = list(self.inner.configure_evaluate(server_round, arrays, config, grid))
        if self.model_via == "ipfs":
            self._instruct(messages, server_round, arrays)
        return messages

    def _instruct(
        self, messages: list[Message], server_round: int, arrays: ArrayRecord
    ) -> Instruction:
        """Add gradstore's ConfigRecord to ``messages``; with ``model_via="ipfs"``, the model
        goes into the store and each message names its CID instead of carrying its arrays."""
        model = None
        if self.model_via == "ipfs" and messages:
            tensors = arrays_to_tensors(arrays, self.limits)  # the server's own model
            gradient = Gradient(tensors, model_meta(self.job, self.run_id, server_round))
            model = str(self._io.run(lambda store: store.put(gradient)))
            for msg in messages:
                for name in list(msg.content.array_records):
                    del msg.content[
                        name
                    ]  # a plain client fails loudly instead of training on nothing
        instruction = Instruction(self.job, self.run_id, server_round, self.key.did, model)
        for msg in messages:
            msg.content[CONFIG_KEY] = ConfigRecord(instruction.to_config())
        return instruction

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round, replies)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        start = time.perf_counter()
        self._announced = {}
        instruction = self._instructions.get(server_round) or Instruction(
            self.job, self.run_id, server_round, self.key.did
        )
        rules = ReplyRules(
            instruction,
            self.limits,
            self.weighted_by_key,
            self.peers,
            self.allow_unsigned,
            self._custodial,
        )
        candidates: list[Candidate] = []
        refused: list[RefusedError] = []
        contents: dict[str, RecordDict] = {}
        for msg in replies:
            try:
                candidate = read_reply(msg, rules)
                self._bind(candidate)
            except RefusedError as exc:
                refused.append(exc)
                continue
            candidates.append(candidate)
            contents[candidate.peer] = msg.content

        stages: dict[str, float] = {}

        async def step(store: GradientStore) -> tuple[list[VerifiedInput], Any, Any]:
            t0 = time.perf_counter()
            verified = await self._verify_all(store, instruction, candidates, refused)
            stages["verify_s"] = round(time.perf_counter() - t0, 3)
            if not verified:
                return verified, None, None
            return verified, *await self._close(store, server_round, verified, refused, stages)

        verified, closed, tensors = self._io.run(step)
        excluded = tuple(dict.fromkeys((self._name(r), _reason(r.reason)) for r in refused))
        for peer, reason in excluded:
            log(WARNING, "gradstore round %s: refused %s: %s", server_round, peer, reason)
        inputs = tuple(sorted((v.peer, v.cid) for v in verified))
        self.history[server_round] = FlowerRound(
            server_round,
            None if closed is None else closed.record_cid,
            None if closed is None else closed.output,
            inputs,
            excluded,
            sum(c.flower_bytes for c in candidates),
            time.perf_counter() - start,
            stages,
        )
        metrics = self._metrics([contents[p] for p, _ in inputs if p in contents])
        metrics[INPUTS_METRIC] = len(inputs) if closed is not None else 0
        metrics[EXCLUDED_METRIC] = len(excluded)
        if closed is None:
            log(WARNING, "gradstore round %s: nothing aggregated", server_round)
            return None, metrics
        metrics[RECORD_METRIC] = cid_metric(closed.record_cid)
        self._prev = closed.record_cid
        log(
            INFO,
            "gradstore round %s: %d inputs, %d refused, aggregate %s, record %s",
            server_round,
            len(inputs),
            len(excluded),
            closed.output,
            closed.record_cid,
        )
        return tensors_to_arrays(tensors, self._order), metrics

    # -- pieces ------------------------------------------------------------------
    def _expect(self, arrays: ArrayRecord) -> None:
        """The global model's names (Flower's order) and schema: what every reply must match."""
        schema = []
        for name, array in arrays.items():
            code = dtype_code(np.dtype(array.dtype))
            if code is None:
                raise GradstoreError(
                    f"the model's array {name!r} has dtype {array.dtype}, "
                    "which gradstore/1 cannot hold"
                )
            schema.append((name, code, tuple(int(d) for d in array.shape)))
        self._order = list(arrays.keys())
        self._schema = tuple(sorted(schema, key=lambda s: s[0].encode()))

    def _custodial(self, node_id: int) -> str:
        return custodial_did(self._secret, node_id)

    def _sign_for(self, c: Candidate, got: VerifiedInput, ins: Instruction) -> tuple[int, bytes]:
        """An unsigned client's announcement, signed with its custodial key (the strategy's
        word, as the docs say): the record's inputs all carry ``peer_sig``."""
        key = custodial_key(self._secret, c.node_id)
        ann = Announce(
            ins.job, ins.run, ins.round, key.did, str(got.cid.to_v1()), c.num_samples, _now_ms()
        )
        return ann.sent_at, announcement_signature(encode_message(ann, key))[1]

    def _name(self, refusal: RefusedError) -> str:
        """The did a refusal is recorded under: the one it proved, else the node's."""
        if refusal.peer is not None:
            return refusal.peer
        assert refusal.node_id is not None  # every refusal of a reply names its node
        return self._node_dids.get(refusal.node_id) or self._custodial(refusal.node_id)

    def _bind(self, c: Candidate) -> None:
        """One Flower node, one did, for the whole run (either way round)."""
        known = self._node_dids.get(c.node_id)
        if known is not None and known != c.peer:
            raise RefusedError(
                Reason.IDENTITY,
                f"node {c.node_id} replied as {known} before",
                node_id=c.node_id,
                peer=c.peer,
                cid=c.cid,
            )
        owner = self._did_nodes.get(c.peer)
        if owner is not None and owner != c.node_id:
            raise RefusedError(
                Reason.IDENTITY,
                f"{c.peer} is node {owner}'s, not {c.node_id}'s",
                node_id=c.node_id,
                peer=c.peer,
                cid=c.cid,
            )
        self._node_dids[c.node_id] = c.peer
        self._did_nodes[c.peer] = c.node_id

    async def _verify_all(
        self,
        store: GradientStore,
        instruction: Instruction,
        candidates: list[Candidate],
        refused: list[RefusedError],
    ) -> list[VerifiedInput]:
        """Every candidate's first attempt, then retries of the fetches that failed in passing:
        a CID nobody serves never holds a place an honest input waits for."""
        gate = asyncio.Semaphore(FETCH_CONCURRENCY)
        verified: list[VerifiedInput] = []
        failures: dict[int, str] = {}

        async def one(c: Candidate) -> Candidate | None:
            """None when settled (verified or refused); the candidate when worth retrying."""
            async with gate:
                try:
                    if c.tensors is not None:
                        got = await self._from_arrays(store, instruction, c)
                    else:
                        got = await self._from_cid(store, instruction, c)
                    verified.append(got)
                    self._announced[got.peer] = c.announced or self._sign_for(c, got, instruction)
                except RefusedError as exc:
                    refused.append(exc)
                except (NodeError, TimeoutError) as exc:
                    failures[c.node_id] = str(exc) or type(exc).__name__
                    return c
            return None

        pending = candidates
        delays = replace(FETCH_RETRY, retries=self.fetch_attempts - 1).delays()
        while True:
            pending = [c for c in await asyncio.gather(*(one(c) for c in pending)) if c]
            delay = next(delays, None)
            if not pending or delay is None:
                break
            await asyncio.sleep(delay)
        for c in pending:
            refused.append(
                RefusedError(
                    Reason.UNAVAILABLE,
                    f"{c.cid} after {self.fetch_attempts} attempts: {failures[c.node_id]}",
                    node_id=c.node_id,
                    peer=c.peer,
                    cid=c.cid,
                )
            )
        return self._first_of_each_cid(candidates, verified, refused)

    def _first_of_each_cid(
        self,
        candidates: list[Candidate],
        verified: list[VerifiedInput],
        refused: list[RefusedError],
    ) -> list[VerifiedInput]:
        """``verified`` without the inputs whose CID an earlier reply of the round holds
        (refused as ``duplicate-cid``): a client cannot enter again what another sent."""
        order = {c.peer: i for i, c in enumerate(candidates)}
        by_peer = {c.peer: c for c in candidates}
        verified.sort(key=lambda v: order[v.peer])
        repeated = duplicates((v.peer, str(v.cid)) for v in verified)
        for peer, reason in repeated.items():
            c = by_peer[peer]
            refused.append(
                RefusedError.parse(reason).about(node_id=c.node_id, peer=peer, cid=c.cid)
            )
            self._announced.pop(peer, None)
        return [v for v in verified if v.peer not in repeated]

    def _claim(self, ins: Instruction, c: Candidate) -> Claim:
        """What ``c``'s reply says of its document: the round kernel checks the document's meta."""
        return Claim(c.peer, ins.round, ins.job, c.num_samples, ins.run, self.require_bound_meta)

    async def _from_arrays(
        self, store: GradientStore, ins: Instruction, c: Candidate
    ) -> VerifiedInput:
        """Arrays that came through Flower, as the document the client would have stored:
        verified by the round kernel, stored and pinned."""
        assert c.tensors is not None
        meta = reply_meta(ins.job, ins.run, ins.round, c.peer, c.num_samples)
        try:
            gradient = Gradient(c.tensors, meta)
        except (GradstoreError, TypeError, ValueError) as exc:
            raise RefusedError(
                Reason.MALFORMED, str(exc), node_id=c.node_id, peer=c.peer, cid=c.cid
            ) from None
        try:
            return await verify_gradient(
                store,
                c.peer,
                gradient,
                c.num_samples,
                expected=self._schema,
                clip=self._job.clip_input_norm is not None,
                claim=self._claim(ins, c),
                announced=c.cid,
            )
        except RefusedError as exc:
            raise exc.about(node_id=c.node_id, peer=c.peer, cid=c.cid) from None

    async def _from_cid(
        self, store: GradientStore, ins: Instruction, c: Candidate
    ) -> VerifiedInput:
        """One attempt at a CID announced instead of arrays, as the coordinator fetches it
        (and bound to the announcement by the document's meta, as the coordinator does).

        ``RefusedError`` is final; a ``NodeError`` or ``TimeoutError`` may pass (retried later).
        """
        assert c.cid is not None
        try:
            return await verify_input(
                store.node,
                store,
                c.peer,
                c.cid,
                c.num_samples,
                expected=self._schema,
                resolve_timeout_s=self.resolve_timeout_s,
                budget=self._budget,
                keep=self._keep,
                clip=self._job.clip_input_norm is not None,
                claim=self._claim(ins, c),
            )
        except RefusedError as exc:
            raise exc.about(node_id=c.node_id, peer=c.peer, cid=c.cid) from None

    async def _close(
        self,
        store: GradientStore,
        round_: int,
        verified: list[VerifiedInput],
        refused: list[RefusedError],
        stages: dict[str, float],
    ) -> tuple[Any, dict[str, np.ndarray[Any, Any]] | None]:
        config = replace(self._job, peers=tuple(sorted({v.peer for v in verified})))
        excluded = list(
            dict.fromkeys(
                (self._name(r), _reason(r.reason), None if r.cid is None else str(r.cid))
                for r in refused
            )
        )
        try:
            closed = await close_round(
                config,
                self.key,
                store.node,
                store,
                run=self.run_id,
                round_=round_,
                inputs=verified,
                excluded=excluded,
                prev=self._prev,
                announcements=self._announced,
            )
        except AggregationError as exc:
            log(
                WARNING, "gradstore round %s: %s refuses the inputs: %s", round_, config.method, exc
            )
            return None, None
        stages.update(closed.stats)
        t0 = time.perf_counter()
        aggregate = await store.get(closed.output)  # what the record names, verified again
        stages["read_back_s"] = round(time.perf_counter() - t0, 3)
        return closed, dict(aggregate.tensors)

    def _metrics(self, contents: list[RecordDict]) -> MetricRecord:
        """The inner strategy's aggregation of the accepted replies' metrics (if it has one)."""
        aggregate_fn = getattr(self.inner, "train_metrics_aggr_fn", None)
        if not contents or not callable(aggregate_fn):
            return MetricRecord()
        try:
            metrics = aggregate_fn(contents, self.weighted_by_key)
        except Exception as exc:  # a client's odd metrics must not cost the round
            log(WARNING, "gradstore: the inner strategy could not aggregate metrics: %s", exc)
            return MetricRecord()
        return metrics if isinstance(metrics, MetricRecord) else MetricRecord()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _reason(text: str) -> str:
    text = " ".join(text.split()) or "refused"
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."
