"""Honest stepped rounds, built and signed here with the coordinator's own key as docs/spec.md
section 9 says a coordinator writes them: one document per peer and step (its tensors
exactly the step's, its announcement naming the step), a step record per closed step, the
model-level output assembled from the steps' outputs, and a round/5 record linking them.

The pieces are separate functions so forgery tests can change one and re-sign the rest.
A ``Model`` says what a round is built over (tensors, dtypes, steps, peers, and the codecs
and values of the peers' documents); ``DEFAULT`` is the three-step model most tests use. A
step whose peers compress their documents is closed by the coordinator's own
``close_round`` (verified inputs, decompressed range by range), as a live coordinator does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradstore.aggregate import aggregate_with_info
from gradstore.compress import compress
from gradstore.coordinator.closing import close_round
from gradstore.dag import CID, DAG_CBOR
from gradstore.format import CompressedGradient, Gradient
from gradstore.job import JobConfig, StepConfig, parse_job
from gradstore.messages import (
    Announce,
    RecordInput,
    RoundStep,
    SigningKey,
    SteppedRoundRecord,
    StepRecord,
    announcement_signature,
    encode_message,
    encode_step_record,
    encode_stepped_record,
    model_meta,
    step_aggregate_meta,
)
from gradstore.node import Node
from gradstore.store import GradientStore, put_model

from .rounds import COORDINATOR, JOB, RUN, SENT_AT_MS, key, verified_input

#: Draws a tensor's values: (generator, tensor name, shape) -> float64 array.
Values = Callable[[np.random.Generator, str, tuple[int, ...]], np.ndarray]


def standard_normal(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Every tensor's values unless a model says otherwise."""
    return np.asarray(rng.standard_normal(shape))


#: The model's tensors and shapes; the steps below cover each once (backward order).
SHAPES: Mapping[str, tuple[int, ...]] = {
    "fc.bias": (5,),
    "fc.weight": (8, 5),
    "layer.bias": (8,),
    "layer.weight": (16, 8),
    "embed.weight": (30, 16),
}
STEPS: Sequence[dict[str, Any]] = (
    {"name": "head", "tensors": ["fc.*"]},
    {"name": "mid", "tensors": ["layer.weight", "layer.bias"], "method": "median"},
    {"name": "emb", "tensors": ["embed.*"], "method": "mean"},
)


@dataclass(frozen=True)
class Model:
    """What a stepped round is built over: the model's tensors (``dtypes``: a tensor's dtype,
    float32 unless named), the job's steps (backward order; a step table may name its
    ``peers``) and default ``aggregation``, and ``peers`` peers (``key(0)``...) whose sample
    counts are 10, 20, 30, ... ``codecs``: by step, the codec spec (or None: dense) of each
    of the step's peers' documents, in peer order; ``values`` draws each tensor's values."""

    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: dict(SHAPES))
    steps: Sequence[Mapping[str, Any]] = STEPS
    dtypes: Mapping[str, Any] = field(default_factory=dict)
    peers: int = 3
    aggregation: Mapping[str, Any] = field(default_factory=lambda: {"method": "fedavg"})
    codecs: Mapping[str, Sequence[str | None]] = field(default_factory=dict)
    values: Values = standard_normal

    @property
    def keys(self) -> list[SigningKey]:
        return [key(i) for i in range(self.peers)]

    @property
    def samples(self) -> list[int]:
        return [10 * (i + 1) for i in range(self.peers)]


DEFAULT = Model()
#: ``stepped_round``'s seed: step ``i``'s documents are drawn from ``SEED + i``.
SEED = 11
PEERS = DEFAULT.keys
SAMPLES = DEFAULT.samples


@dataclass
class StepDone:
    """A closed step: its signed record's CID and the record."""

    record_cid: CID
    record: StepRecord


@dataclass
class Stepped:
    """An honest stepped round: its round/5 record and every step's record."""

    record_cid: CID
    record: SteppedRoundRecord
    steps: dict[str, StepDone]
    config: JobConfig


def stepped_job(model: Model = DEFAULT) -> JobConfig:
    return parse_job(
        {
            "job": JOB,
            "coordinator": COORDINATOR.did,
            "peers": [k.did for k in model.keys],
            "aggregation": dict(model.aggregation),
            "rounds": {"count": 1, "quorum": model.peers, "deadline_s": 30},
            "steps": [dict(s) for s in model.steps],
        }
    )


def announcement(
    k: SigningKey, cid: CID, samples: int, round_: int, step: str
) -> tuple[int, bytes]:
    """``k``'s signed announcement of ``cid`` for ``step``: (sent_at, signature)."""
    sent_at = SENT_AT_MS + 60_000 * round_
    ann = Announce(JOB, RUN, round_, k.did, str(cid.to_v1()), samples, sent_at, step=step)
    return ann.sent_at, announcement_signature(encode_message(ann, k))[1]


def step_tensors(step: StepConfig, model: Model = DEFAULT) -> list[str]:
    return [name for name in model.shapes if step.covers(name)]


async def peer_documents(
    node: Node,
    step: StepConfig,
    round_: int,
    seed: int,
    names: Sequence[str] | None = None,
    model: Model = DEFAULT,
) -> list[tuple[SigningKey, CID, int]]:
    """Each of the step's peers' document for ``step`` (``names``: other tensors than the
    step's, for a peer that lies), compressed with its codec in ``model.codecs``, stored on
    ``node``: (peer key, CID, samples)."""
    rng = np.random.default_rng(seed)
    store = GradientStore(node)
    codecs = iter(model.codecs.get(step.name, ()))
    out = []
    for k, samples in zip(model.keys, model.samples, strict=True):
        if k.did not in step.peers:
            continue
        tensors = {
            n: model.values(rng, n, model.shapes[n]).astype(model.dtypes.get(n, np.float32))
            for n in (names or step_tensors(step, model))
        }
        meta = {"kind": "gradient", "job": JOB, "round": round_, "peer": k.did, "step": step.name}
        dense = Gradient(tensors, {**meta, "num_samples": samples})
        codec = next(codecs, None)
        doc: Gradient | CompressedGradient = dense if codec is None else compress(dense, codec)
        out.append((k, await store.put(doc), samples))
    return out


async def close_step(
    node: Node,
    step: StepConfig,
    round_: int,
    documents: Sequence[tuple[SigningKey, CID, int]],
    *,
    announced_step: str | None = None,
) -> StepRecord:
    """The record of ``step`` over ``documents``, each announced by its peer for the step
    (or for ``announced_step``), with the aggregate recomputed and stored (not yet signed)."""
    store = GradientStore(node)
    ordered = sorted(documents, key=lambda d: d[0].did)
    params = step.params_for([k.did for k, _, _ in ordered])
    docs = [await store.get(cid) for _, cid, _ in ordered]
    tensors, info = aggregate_with_info(
        [d.tensors for d in docs], params, [n for _, _, n in ordered]
    )
    cids = [cid for _, cid, _ in ordered]
    meta = step_aggregate_meta(JOB, round_, step.name, params.method, cids, run=RUN)
    output = await store.put(Gradient(tensors, meta))
    weights = info.weights or tuple(1.0 for _ in ordered)
    inputs = tuple(
        RecordInput(
            k.did,
            cid,
            n,
            float(w),
            None,
            *announcement(k, cid, n, round_, announced_step or step.name),
        )
        for (k, cid, n), w in zip(ordered, weights, strict=True)
    )
    return StepRecord(
        job=JOB,
        run=RUN,
        round=round_,
        step=step.name,
        tensors=tuple(str(s) for s in step.tensors),
        method=params.method,
        params=params.to_record(),
        inputs=inputs,
        excluded=(),
        output=output,
        coordinator=COORDINATOR.did,
    )


async def coordinator_step(
    node: Node,
    config: JobConfig,
    step: StepConfig,
    round_: int,
    documents: Sequence[tuple[SigningKey, CID, int]],
) -> StepDone:
    """``step`` closed over ``documents`` by the coordinator's own code: each input verified
    as the coordinator verifies an announced one (a compressed one is decompressed range by
    range), aggregated, stored and signed by ``close_round`` into a step record."""
    store = GradientStore(node)
    clip = step.aggregation.clip_input_norm is not None
    inputs = [
        await verified_input(node, store, k.did, cid, n, clip, step) for k, cid, n in documents
    ]
    signed = {k.did: announcement(k, cid, n, round_, step.name) for k, cid, n in documents}
    closed = await close_round(
        config,
        COORDINATOR,
        node,
        store,
        run=RUN,
        round_=round_,
        inputs=inputs,
        excluded=[],
        prev=None,
        announcements=signed,
        step=step,
    )
    assert isinstance(closed.record, StepRecord)
    return StepDone(closed.record_cid, closed.record)


async def sign_step(node: Node, record: StepRecord) -> StepDone:
    """Sign ``record`` with the coordinator's key and store it."""
    _, data = encode_step_record(record, COORDINATOR)
    return StepDone(await node.put_block(data, DAG_CBOR), record)


async def publish_round(
    node: Node,
    round_: int,
    steps: Sequence[tuple[str, StepDone | str]],
    prev: CID | None = None,
    *,
    model: CID | None = None,
) -> tuple[CID, SteppedRoundRecord]:
    """The round/5 record over ``steps`` ((name, closed step or the reason it failed), in
    the job's order), its model-level output assembled and stored (unless ``model`` says
    what the record names instead), signed and stored."""
    entries = tuple(
        RoundStep(name, failed=done)
        if isinstance(done, str)
        else RoundStep(name, record=done.record_cid, output=done.record.output)
        for name, done in steps
    )
    closed = [e for e in entries if e.failed is None]
    outputs = [e.output for e in closed if e.output is not None]
    meta = model_meta(JOB, round_, [e.step for e in closed], outputs, run=RUN)
    if model is None:
        model = await put_model(GradientStore(node), outputs, meta)
    record = SteppedRoundRecord(JOB, RUN, round_, entries, model, prev, COORDINATOR.did)
    return await sign_round(node, record), record


async def sign_round(node: Node, record: SteppedRoundRecord) -> CID:
    """Sign a round/5 record with the coordinator's key and store it."""
    _, data = encode_stepped_record(record, COORDINATOR)
    return await node.put_block(data, DAG_CBOR)


async def stepped_round(
    node: Node,
    round_: int = 0,
    prev: CID | None = None,
    seed: int = SEED,
    model: Model = DEFAULT,
    failed: Mapping[str, str] | None = None,
) -> Stepped:
    """An honest stepped round of every step of ``model``; the steps ``failed`` names failed
    (no documents, no step record: the round/5 record gives the reason). A step that
    ``model.codecs`` names is closed by the coordinator's ``close_round``."""
    config = stepped_job(model)
    done: dict[str, StepDone] = {}
    steps: list[tuple[str, StepDone | str]] = []
    for i, step in enumerate(config.steps):
        if failed and step.name in failed:
            steps.append((step.name, failed[step.name]))
            continue
        documents = await peer_documents(node, step, round_, seed + i, model=model)
        if step.name in model.codecs:
            done[step.name] = await coordinator_step(node, config, step, round_, documents)
        else:
            done[step.name] = await sign_step(node, await close_step(node, step, round_, documents))
        steps.append((step.name, done[step.name]))
    cid, record = await publish_round(node, round_, steps, prev)
    return Stepped(cid, record, done, config)


def step_config(config: JobConfig, name: str) -> StepConfig:
    return next(s for s in config.steps if s.name == name)


def replace_step(stepped: Stepped, name: str, done: StepDone | str) -> list[tuple[str, Any]]:
    """``stepped``'s steps with step ``name`` replaced (by a forged record, or a failure)."""
    return [(n, done if n == name else d) for n, d in stepped.steps.items()]


def resigned(record: StepRecord, **changes: Any) -> StepRecord:
    return dataclasses.replace(record, **changes)
