"""Closing a round: aggregate the verified inputs, store the aggregate and the signed record.

Node calls here are retried with backoff while the node is unreachable or answers 5xx:
a Kubo that drops for a few seconds while the aggregate is stored must not lose the
round. The record links only verified inputs (an excluded input's CID is text, not a
link), it is pinned directly and the aggregate recursively, so pinning never walks an
input nobody serves, nor the whole history behind ``prev``.

A step of a stepped job closes the same way, with the step's method and parameters, into
a step record (``gradstore/step/1``: no ``prev``, the step's name and selectors).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ..aggregate import (
    InMemory,
    InputSource,
    Layout,
    aggregate_streamed,
    compressed_source,
    prepare,
)
from ..dag import CID, Block
from ..dag.cid import DAG_CBOR
from ..errors import CoordinatorError, DAGError, NodeError, NodeUnreachableError
from ..format import CompressedGradient, Gradient
from ..job import JobConfig, StepConfig
from ..messages import (
    PartialRecord,
    RecordExclusion,
    RecordInput,
    RoundRecord,
    SigningKey,
    StepRecord,
    aggregate_meta,
    encode_record,
    encode_step_record,
    step_aggregate_meta,
)
from ..node import Node, Retry
from ..store import (
    GradientStore,
    ReadAhead,
    ReadAheadPool,
    SpilledDocument,
    StoredCompressed,
    StoredDocument,
    StoredGradient,
    read_ahead,
    spilled_source,
)
from .inputs import VerifiedInput

log = logging.getLogger("gradstore.coordinator")

T = TypeVar("T")

#: How long the close keeps retrying a node that fails, before the node counts as lost.
DEFAULT_CLOSE_RETRY_S: Final = 300.0


@dataclass(frozen=True)
class Closed:
    """What a closed round (or step: a ``StepRecord``) stored."""

    output: CID
    record: RoundRecord | StepRecord | PartialRecord
    record_cid: CID
    stats: dict[str, Any]
    #: the output document in memory, as stored (a step's: the model-level output takes its
    #: tensors from here rather than reading them back from the node)
    aggregate: Gradient | None = None


async def with_retries(
    what: str, call: Callable[[], Awaitable[T]], *, give_up_after: float = DEFAULT_CLOSE_RETRY_S
) -> T:
    """``await call()``, retried with backoff on node errors for up to ``give_up_after`` s.

    Errors that a retry cannot fix (a node that refuses the request) are raised at once;
    an unreachable or failing node is retried, and raised once the time is up.
    """
    deadline = time.monotonic() + give_up_after

    def passing(error: Exception) -> bool:
        transient = isinstance(error, NodeUnreachableError) or _server_side(error)
        if transient and time.monotonic() < deadline:
            log.warning("%s failed (%s); retrying", what, error)
            return True
        return False

    return await CLOSE_RETRY.call(call, retry_on=passing)


#: Backoff while a round's close waits for its node (the time limit is the caller's).
CLOSE_RETRY: Final = Retry(retries=None, backoff=0.2, max_backoff=10.0)


def _spilled(item: VerifiedInput) -> InputSource | None:
    """A source over ``item``'s spill file (the bytes it was verified by), or None when it
    has none or it cannot be opened (then the node is read, as without a spill)."""
    if item.spill is None:
        return None
    try:
        document = SpilledDocument(item.spill, item.nbytes)
    except (OSError, DAGError) as exc:
        log.warning("spill file of %s unusable (%s): reading it from the node", item.cid, exc)
        return None
    return spilled_source(document, item.tensors, item.codec)


def _opener(
    node: Node, item: VerifiedInput, max_bytes: int, pool: ReadAheadPool
) -> Callable[[], Awaitable[Any]]:
    """Opens ``item`` on the node: read ahead by large ranges through ``pool``, every leaf
    hashed again (a compressed one decompressed range by range)."""

    async def open_() -> StoredGradient | StoredCompressed:
        document = await StoredDocument.open(node, item.cid, max_bytes)
        return spilled_source(read_ahead(document, pool), item.tensors, item.codec)

    return open_


def _server_side(exc: Exception) -> bool:
    status = getattr(exc, "status", None)
    return isinstance(exc, NodeError) and isinstance(status, int) and status >= 500


async def close_round(
    config: JobConfig,
    key: SigningKey,
    node: Node,
    store: GradientStore,
    *,
    run: str,
    round_: int,
    inputs: Sequence[VerifiedInput],
    excluded: Sequence[tuple[str, str, str | None]],
    prev: CID | None,
    announcements: Mapping[str, tuple[int, bytes]],
    give_up_after: float = DEFAULT_CLOSE_RETRY_S,
    step: StepConfig | None = None,
) -> Closed:
    """Aggregate ``inputs`` (canonical order: sorted by peer) and store the round's record.

    ``announcements`` holds each input peer's signed word, ``(sent_at, signature)`` of the
    announcement naming the input's CID and sample count: the record carries it, so an
    auditor checks the counts against the peers, not the coordinator. With a ``step`` (of a
    stepped job), its method and parameters aggregate, into a step record (``prev`` unused).
    Raises ``AggregationError`` when the method refuses the inputs (the round then fails).
    """
    verified = announced_in_order(inputs, announcements)
    stats: dict[str, Any] = {}
    aggregation = config.aggregation if step is None else step.aggregation
    params = aggregation.params_for([i.peer for i in verified])
    t0 = time.perf_counter()
    sources: list[InputSource] = []
    pool = ReadAheadPool()  # the inputs read back from the node share its memory
    try:
        await open_sources(sources, node, store, verified, give_up_after, pool)
        layout = input_layout(verified)
        norms = None if params.clip_input_norm is None else [i.norm or 0.0 for i in verified]
        samples = [i.num_samples for i in verified]
        spills = sum(isinstance(getattr(s, "document", None), SpilledDocument) for s in sources)
        log.info(
            "round %d%s: aggregating %d inputs (%d from spill files)",
            round_,
            "" if step is None else f" step {step.name}",
            len(sources),
            spills,
        )
        result, info = await aggregate_streamed(sources, layout, params, samples, norms=norms)
    finally:
        close_sources(sources)
        del sources
    stats["aggregate_s"] = round(time.perf_counter() - t0, 3)
    stats["spilled_inputs"] = spills
    stats["read_requests"] = pool.requests

    t0 = time.perf_counter()
    cids = [i.cid for i in verified]
    method = aggregation.method
    if step is None:
        meta = aggregate_meta(config.job, round_, method, cids, run=run)
    else:
        meta = step_aggregate_meta(config.job, round_, step.name, method, cids, run=run)
    aggregate = Gradient(result, meta)
    weights = info.weights or tuple(1.0 for _ in verified)
    record_inputs = input_entries(verified, weights, announcements)
    record_excluded = exclusion_entries(excluded)
    record: RoundRecord | StepRecord

    def new_step_record(output: CID) -> StepRecord:
        assert step is not None
        return StepRecord(
            job=config.job,
            run=run,
            round=round_,
            step=step.name,
            tensors=tuple(str(s) for s in step.tensors),
            method=method,
            params=params.to_record(),
            inputs=record_inputs,
            excluded=record_excluded,
            output=output,
            coordinator=key.did,  # the step's owner (docs/design/multicoord.md)
        )

    if step is not None:  # a small aggregate and its record in one request, if it can
        signed: list[tuple[StepRecord, CID, bytes]] = []

        def step_record(output: CID) -> Block:
            rec = new_step_record(output)
            cid, data = encode_step_record(rec, key)
            signed[:] = [(rec, cid, data)]
            return Block(cid, data)

        together = await with_retries(
            "storing the aggregate and its record",
            lambda: store.put_with(aggregate, step_record),
            give_up_after=give_up_after,
        )
        if together is not None:
            output = together[0]
            record, record_cid, _ = signed[0]
            await pin_record(node, record_cid, "step record", give_up_after=give_up_after)
            stats["store_s"] = round(time.perf_counter() - t0, 3)
            return Closed(output, record, record_cid, stats, aggregate)
    output = await with_retries(
        "storing the aggregate", lambda: store.put(aggregate), give_up_after=give_up_after
    )
    if step is None:
        record = RoundRecord(
            job=config.job,
            run=run,
            round=round_,
            method=method,
            params=params.to_record(),
            inputs=record_inputs,
            excluded=record_excluded,
            output=output,
            prev=prev,
            coordinator=config.coordinator,
        )
        record_cid, record_bytes = encode_record(record, key)
    else:
        record = new_step_record(output)
        record_cid, record_bytes = encode_step_record(record, key)

    what = "round record" if step is None else "step record"
    await put_record(node, record_cid, record_bytes, what, give_up_after=give_up_after)
    stats["store_s"] = round(time.perf_counter() - t0, 3)
    return Closed(output, record, record_cid, stats, aggregate)


def announced_in_order(
    inputs: Sequence[VerifiedInput], announcements: Mapping[str, tuple[int, bytes]]
) -> list[VerifiedInput]:
    """``inputs`` in record order (sorted by peer); CoordinatorError if one has no signed
    announcement in ``announcements`` (its record entry would lack the peer's word)."""
    missing = [i.peer for i in inputs if i.peer not in announcements]
    if missing:
        raise CoordinatorError(f"no signed announcement for input(s) of {', '.join(missing)}")
    return sorted(inputs, key=lambda i: i.peer)


def input_entries(
    verified: Sequence[VerifiedInput],
    weights: Sequence[float],
    announcements: Mapping[str, tuple[int, bytes]],
) -> tuple[RecordInput, ...]:
    """A record's inputs: each verified input with its weight and its peer's signed word."""
    return tuple(
        RecordInput(i.peer, i.cid, i.num_samples, float(w), i.codec, *announcements[i.peer])
        for i, w in zip(verified, weights, strict=True)
    )


def exclusion_entries(
    excluded: Sequence[tuple[str, str, str | None]],
) -> tuple[RecordExclusion, ...]:
    """A record's exclusions from (peer, reason, CID text or None) triples."""
    return tuple(
        RecordExclusion(peer, why, None if cid is None else CID.parse(cid))
        for peer, why, cid in excluded
    )


def input_layout(verified: Sequence[VerifiedInput]) -> Layout:
    """The tensors the inputs share (the first's: they were verified against one schema)."""
    return Layout.of((t.name, t.array_dtype, t.shape) for t in verified[0].tensors.values())


async def open_sources(
    sources: list[InputSource],
    node: Node,
    store: GradientStore,
    verified: Sequence[VerifiedInput],
    give_up_after: float,
    pool: ReadAheadPool | None = None,
) -> None:
    """Append to ``sources`` one source per input (in ``verified``'s order): in memory, its
    spill file, or read back from our node (pinned there), range by range read ahead within
    ``pool``'s memory, hashed again; ``close_sources`` closes them, whatever happened."""
    pool = ReadAheadPool() if pool is None else pool
    for item in verified:
        spilled = _spilled(item)
        if isinstance(item.gradient, CompressedGradient):
            sources.append(compressed_source(item.gradient))
        elif item.gradient is not None:
            sources.append(InMemory(item.gradient.tensors))
        elif spilled is not None:  # its verified bytes, from our spill file
            sources.append(spilled)
        else:
            sources.append(
                await with_retries(
                    f"opening {item.cid}",
                    _opener(node, item, store.limits.max_bytes, pool),
                    give_up_after=give_up_after,
                )
            )


def close_sources(sources: Sequence[InputSource]) -> None:
    """Close the spill files and node read-aheads ``open_sources`` opened."""
    for source in sources:
        document = getattr(source, "document", None)
        if isinstance(document, SpilledDocument | ReadAhead):
            document.close()


async def put_record(
    node: Node,
    cid: CID,
    data: bytes,
    what: str = "round record",
    *,
    give_up_after: float = DEFAULT_CLOSE_RETRY_S,
) -> None:
    """Store a signed record's block and pin it (directly: its links are pinned apart),
    retried while the node fails; the node must store it as ``cid``."""

    async def put() -> CID:
        return await node.put_block(data, DAG_CBOR)

    stored = await with_retries(f"storing the {what}", put, give_up_after=give_up_after)
    if stored != cid:
        raise NodeError(f"node stored the {what} as {stored}, expected {cid}")
    await pin_record(node, cid, what, give_up_after=give_up_after)


async def pin_record(
    node: Node, cid: CID, what: str, *, give_up_after: float = DEFAULT_CLOSE_RETRY_S
) -> None:
    """Pin a stored record directly (its links are pinned apart), retried while the node
    fails."""
    await with_retries(
        f"pinning the {what}", lambda: node.pin(cid, recursive=False), give_up_after=give_up_after
    )


async def prepare_aggregation(gradient: Gradient) -> None:
    """Get the aggregators' compiled kernel ready for inputs like ``gradient``, off the loop."""
    try:
        ready = await asyncio.to_thread(prepare, gradient.tensors)
    except Exception:  # the aggregate stage would meet the same problem and report it
        log.exception("preparing the aggregation kernel failed")
    else:
        log.debug("aggregation kernel: %s", "numba" if ready else "NumPy")
