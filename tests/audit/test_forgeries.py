"""A dishonest coordinator signs records that lie, with its own (pinned) key: every field
the record claims is checked against something that is not the coordinator's word."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from gradstore.aggregate import AggregationParams, aggregate_with_info
from gradstore.audit import verify_round
from gradstore.errors import AuditError
from gradstore.format import Gradient
from gradstore.messages import RECORD_TYPE, RECORD_TYPE_SIGNED, RoundRecord, aggregate_meta
from gradstore.node import LocalNode
from gradstore.store import GradientStore

from .rounds import COORDINATOR, Round, announcement, legacy_round, put_record, signed_round


def gradients(n: int, seed: int = 5, shape: tuple[int, ...] = (40, 9)) -> list[Gradient]:
    rng = np.random.default_rng(seed)
    return [Gradient({"w": rng.standard_normal(shape).astype(np.float32)}) for _ in range(n)]


async def audit(node: LocalNode, cid: object) -> str:
    """The check that fails, or "ok"."""
    try:
        await verify_round(node, cid, coordinator=COORDINATOR.did)  # type: ignore[arg-type]
    except AuditError as exc:
        return exc.check
    return "ok"


async def with_recomputed_output(
    node: LocalNode, honest: RoundRecord, **changes: object
) -> RoundRecord:
    """``honest`` with ``changes`` to its inputs, the aggregate recomputed to match them."""
    store = GradientStore(node)
    inputs = tuple(
        dataclasses.replace(i, **changes.get(i.peer, {}))  # type: ignore[arg-type]
        for i in honest.inputs
    )
    docs = [await store.get(i.gradient) for i in inputs]
    norm = "sequential" if honest.type == RECORD_TYPE_SIGNED else "blocked-pairwise"
    params = AggregationParams.from_record(honest.method, honest.params, norm)  # type: ignore[arg-type]
    tensors, info = aggregate_with_info(
        [d.tensors for d in docs], params, [i.num_samples for i in inputs]
    )
    meta = aggregate_meta(
        honest.job, honest.round, honest.method, [i.gradient for i in inputs], run=honest.run
    )
    output = await store.put(Gradient(tensors, meta))
    weights = info.weights or tuple(1.0 for _ in inputs)
    inputs = tuple(dataclasses.replace(i, weight=w) for i, w in zip(inputs, weights, strict=True))
    return dataclasses.replace(honest, inputs=inputs, output=output)


def test_inflated_samples_with_a_matching_aggregate_fail_the_peers_signature(tmp_path):
    async def main() -> None:
        node = LocalNode(tmp_path)
        honest = await signed_round(node, gradients(3), [10, 20, 30], meta=False)
        assert honest.record.type == RECORD_TYPE_SIGNED
        assert await audit(node, honest.record_cid) == "ok"
        first = honest.record.inputs[0]
        forged = await with_recomputed_output(
            node, honest.record, **{first.peer: {"num_samples": first.num_samples * 50}}
        )
        assert forged.output != honest.record.output  # the aggregate was made to match
        assert await audit(node, await put_record(node, forged)) == "input-signature"

    asyncio.run(main())


def test_inflated_samples_against_the_documents_meta_fail_in_old_records_too(tmp_path):
    async def main() -> None:
        node = LocalNode(tmp_path)
        honest = await legacy_round(node, gradients(3), [10, 20, 30])
        assert honest.record.type == RECORD_TYPE
        assert await audit(node, honest.record_cid) == "ok"
        first = honest.record.inputs[0]
        forged = await with_recomputed_output(
            node, honest.record, **{first.peer: {"num_samples": first.num_samples * 50}}
        )
        assert await audit(node, await put_record(node, forged)) == "input-samples"

    asyncio.run(main())


@pytest.mark.parametrize("signed", [True, False])
def test_multikrum_weights_swapped_between_a_selected_and_an_unselected_peer_fail(tmp_path, signed):
    async def main() -> None:
        node = LocalNode(tmp_path)
        grads = gradients(6, seed=9)
        grads[2] = Gradient({"w": grads[2].tensors["w"] * 40})  # an outlier: not selected
        make = signed_round if signed else legacy_round
        honest: Round = await make(node, grads, [1] * 6, "multikrum", byzantine=1, select=3)
        assert await audit(node, honest.record_cid) == "ok"
        weights = [i.weight for i in honest.record.inputs]
        chosen, dropped = weights.index(1 / 3), weights.index(0.0)
        swapped = list(honest.record.inputs)
        swapped[chosen] = dataclasses.replace(swapped[chosen], weight=0.0)
        swapped[dropped] = dataclasses.replace(swapped[dropped], weight=1 / 3)
        forged = dataclasses.replace(honest.record, inputs=tuple(swapped))  # same output
        assert await audit(node, await put_record(node, forged)) == "input-weight"

    asyncio.run(main())


def test_a_fedavg_weight_that_is_not_the_methods_fails(tmp_path):
    async def main() -> None:
        node = LocalNode(tmp_path)
        honest = await signed_round(node, gradients(3), [10, 20, 30])
        inputs = list(honest.record.inputs)
        inputs[1] = dataclasses.replace(inputs[1], weight=inputs[1].weight * 2)
        forged = dataclasses.replace(honest.record, inputs=tuple(inputs))
        assert await audit(node, await put_record(node, forged)) == "input-weight"

    asyncio.run(main())


def test_last_rounds_document_replayed_fails_input_meta_in_a_signed_record(tmp_path):
    async def main() -> None:
        node = LocalNode(tmp_path)
        old = await signed_round(node, gradients(3), [10, 20, 30], round_=0)
        later = await signed_round(node, gradients(3, seed=6), [10, 20, 30], round_=1)
        first = later.record.inputs[0]
        replayed = old.record.inputs[0].gradient  # its meta says round 0
        assert old.record.inputs[0].peer == first.peer
        signer = next(k for k in later.peer_keys if k.did == first.peer)
        sent_at, sig = announcement(signer, replayed, first.num_samples, 1)  # truly signed
        moved = dataclasses.replace(first, gradient=replayed, sent_at=sent_at, peer_sig=sig)
        forged = await with_recomputed_output(node, later.record)
        forged = dataclasses.replace(forged, inputs=(moved, *forged.inputs[1:]))
        forged = await with_recomputed_output(node, forged)
        assert await audit(node, await put_record(node, forged)) == "input-meta"

    asyncio.run(main())
