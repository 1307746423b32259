"""Honest rounds built by the coordinator's own code on any node, for audit tests and vectors.

``signed_round`` closes a round with ``coordinator.closing.close_round`` (a round/4 record,
peers' announcements signed by their keys); ``legacy_round`` writes the round/2 or round/3
record an earlier coordinator wrote (no peer signatures; norms summed blockwise-pairwise,
the output rounded before it is clipped).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gradstore.aggregate import (
    AggregationParams,
    InMemory,
    Layout,
    aggregate_streamed,
    compressed_source,
)
from gradstore.compress import compress
from gradstore.coordinator.closing import close_round
from gradstore.coordinator.inputs import ByteBudget, VerifiedInput, verify_input
from gradstore.dag import CID, DAG_CBOR
from gradstore.format import CompressedGradient, Gradient
from gradstore.job import JobConfig, parse_job
from gradstore.messages import (
    Announce,
    RecordInput,
    RoundRecord,
    SigningKey,
    aggregate_meta,
    announcement_signature,
    encode_message,
    encode_record,
)
from gradstore.node import Node
from gradstore.store import GradientStore

RUN = "testrun0testrun0testrun0"
JOB = "audit-job"


def key(i: int) -> SigningKey:
    return SigningKey.from_seed(bytes([i + 7]) * 32)


COORDINATOR = key(200)


@dataclass
class Round:
    record_cid: CID
    record: RoundRecord
    config: JobConfig
    peer_keys: list[SigningKey]


def job(peers: Sequence[SigningKey], method: str, **aggregation: Any) -> JobConfig:
    return parse_job(
        {
            "job": JOB,
            "coordinator": COORDINATOR.did,
            "peers": [k.did for k in peers],
            "aggregation": {"method": method, **aggregation},
            "rounds": {"count": 1, "quorum": len(peers), "deadline_s": 30},
        }
    )


def with_meta(gradient: Gradient, peer: str, samples: int, round_: int) -> Gradient:
    """The meta ``Peer.prepare`` writes: the document names its job, round, peer and samples."""
    meta = {"kind": "gradient", "round": round_, "peer": peer, "num_samples": samples, "job": JOB}
    return Gradient(gradient.tensors, {**gradient.meta, **meta})


def _document(
    gradient: Gradient, codec: str | None, peer: str, samples: int, round_: int, meta: bool
) -> Gradient | CompressedGradient:
    doc = with_meta(gradient, peer, samples, round_) if meta else gradient
    return doc if codec is None else compress(doc, codec)


async def _verified(
    node: Node, store: GradientStore, peer: str, cid: CID, samples: int, clip: bool
) -> VerifiedInput:
    big = ByteBudget(1 << 31)
    return await verify_input(
        node,
        store,
        peer,
        cid,
        samples,
        expected=None,
        resolve_timeout_s=30.0,
        budget=big,
        keep=big,
        clip=clip,
    )


def announcement(k: SigningKey, cid: CID, samples: int, round_: int) -> tuple[int, bytes]:
    """``k``'s signed announcement of ``cid``: (sent_at, signature)."""
    ann = Announce(JOB, RUN, round_, k.did, str(cid.to_v1()), samples, int(time.time() * 1000))
    return ann.sent_at, announcement_signature(encode_message(ann, k))[1]


async def signed_round(
    node: Node,
    gradients: Sequence[Gradient],
    samples: Sequence[int],
    method: str = "fedavg",
    *,
    codecs: Sequence[str | None] | None = None,
    meta: bool = True,
    round_: int = 0,
    prev: CID | None = None,
    peer_keys: Sequence[SigningKey] | None = None,
    **aggregation: Any,
) -> Round:
    """A round closed by ``close_round``: the record a coordinator writes today (round/4)."""
    keys = list(peer_keys or [key(i) for i in range(len(gradients))])
    config = job(keys, method, **aggregation)
    store = GradientStore(node)
    inputs, signed = [], {}
    for i, (k, g, n) in enumerate(zip(keys, gradients, samples, strict=True)):
        doc = _document(g, None if codecs is None else codecs[i], k.did, n, round_, meta)
        cid = await store.put(doc)
        inputs.append(
            await _verified(node, store, k.did, cid, n, config.clip_input_norm is not None)
        )
        signed[k.did] = announcement(k, cid, n, round_)
    closed = await close_round(
        config,
        COORDINATOR,
        node,
        store,
        run=RUN,
        round_=round_,
        inputs=inputs,
        excluded=[],
        prev=prev,
        announcements=signed,
    )
    return Round(closed.record_cid, closed.record, config, keys)


async def legacy_round(
    node: Node,
    gradients: Sequence[Gradient],
    samples: Sequence[int],
    method: str = "fedavg",
    *,
    codecs: Sequence[str | None] | None = None,
    meta: bool = True,
    round_: int = 0,
    **aggregation: Any,
) -> Round:
    """The round/2 (round/3 when an input is compressed) record an earlier coordinator wrote:
    no peers' signatures, input and output norms summed blockwise-pairwise, and the output
    rounded before it is clipped."""
    keys = [key(i) for i in range(len(gradients))]
    config = job(keys, method, **aggregation)
    store = GradientStore(node)
    verified = []
    for i, (k, g, n) in enumerate(zip(keys, gradients, samples, strict=True)):
        doc = _document(g, None if codecs is None else codecs[i], k.did, n, round_, meta)
        cid = await store.put(doc)
        verified.append(await _verified(node, store, k.did, cid, n, False))
    verified.sort(key=lambda v: v.peer)
    params = config.params_for([v.peer for v in verified])
    params = AggregationParams.from_record(
        params.method, params.to_record(), "blocked-pairwise", "rounded"
    )
    sources = [
        compressed_source(v.gradient)
        if isinstance(v.gradient, CompressedGradient)
        else InMemory(v.gradient.tensors)
        for v in verified
        if v.gradient is not None
    ]
    layout = Layout.of((t.name, t.array_dtype, t.shape) for t in verified[0].tensors.values())
    tensors, info = await aggregate_streamed(
        sources, layout, params, [v.num_samples for v in verified]
    )
    cids = [v.cid for v in verified]
    output = await store.put(Gradient(tensors, aggregate_meta(JOB, round_, method, cids, run=RUN)))
    weights = info.weights or tuple(1.0 for _ in verified)
    record = RoundRecord(
        job=JOB,
        run=RUN,
        round=round_,
        method=method,
        params=params.to_record(),
        inputs=tuple(
            RecordInput(v.peer, v.cid, v.num_samples, float(w), v.codec)
            for v, w in zip(verified, weights, strict=True)
        ),
        excluded=(),
        output=output,
        prev=None,
        coordinator=COORDINATOR.did,
    )
    return Round(await put_record(node, record), record, config, keys)


async def put_record(node: Node, record: RoundRecord, signer: SigningKey = COORDINATOR) -> CID:
    """Sign ``record`` (with the coordinator's own key unless told) and store it."""
    _, data = encode_record(record, signer)
    return await node.put_block(data, DAG_CBOR)


def samples_of(record: RoundRecord) -> Mapping[str, int]:
    return {i.peer: i.num_samples for i in record.inputs}
