"""A round of compressed inputs across real Kubo daemons, recomputed bit for bit from its
record by the audit tools; a record that lies about a codec is caught."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import dag_cbor
import numpy as np
import pytest

from gradstore.audit import verify_round
from gradstore.compress import compress
from gradstore.coordinator.inputs import _check
from gradstore.dag import DAG_CBOR
from gradstore.errors import AuditError
from gradstore.format import Codec, CompressedGradient, CompressedTensor, Gradient
from gradstore.messages import decode_record, encode_record
from gradstore.store import GradientStore

from .harness import gradients, make_job, publish_all, start_coordinator, wait_subscribed, world

SPECS = ["topk:0.02,values=int8", "int8:1024", "topk:0.05,values=2bit", None]


def _compressed(grads: list[Gradient]) -> list[Gradient | CompressedGradient]:
    return [g if spec is None else compress(g, spec) for g, spec in zip(grads, SPECS, strict=True)]


@pytest.mark.parametrize(
    ("method", "keep_bytes"),
    [("fedavg", None), ("fedavg", 0), ("trimmed_mean", 0)],
)
def test_a_compressed_round_is_audited_bit_for_bit(
    kubo_factory: Any, tmp_path: Path, method: str, keep_bytes: int | None
) -> None:
    # keep_bytes=0: the coordinator reads every input back from its node at the close
    # (StoredCompressed, records fetched range by range, every leaf hashed)
    daemons = kubo_factory(3, connect=True)
    extra = {"trim_ratio": 0.25} if method == "trimmed_mean" else {}
    config, coord, peers = make_job(4, method=method, **extra)
    grads = _compressed(gradients(4, 0, shape=(600, 700)))  # 1.6 MiB dense: two leaves
    samples = [3, 1, 4, 1]

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            kw = {} if keep_bytes is None else {"keep_bytes": keep_bytes}
            _, task = start_coordinator(w, tmp_path / "state", **kw)
            await wait_subscribed(w)
            await publish_all(w, 0, grads, samples)
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "closed", outcome
            rcid = outcome.record
            auditor = w.peer_nodes[1]  # another daemon: it fetches everything over the network
            block = await auditor.get_block(rcid)
            assert dag_cbor.decode(block)["type"] == "gradstore/round/3"
            record = decode_record(block, cid=rcid)
            by_peer = {k.did: g for k, g in zip(w.peer_keys, grads, strict=True)}
            for i in record.inputs:
                g = by_peer[i.peer]
                assert i.codec == (g.codec if isinstance(g, CompressedGradient) else None)
            report = await verify_round(auditor, rcid)
            assert report.inputs == 4 and report.record.output == outcome.output
            # the aggregate is dense float32, in the peers' schema
            agg = await GradientStore(auditor).get(outcome.output)
            assert agg.tensors["w"].dtype == np.float32 and agg.tensors["w"].shape == (600, 700)

            # a record lying about one codec parameter (validly re-signed) fails the audit,
            # although the output it names is the right one
            first = record.inputs[0]
            assert first.codec is not None
            lie = dataclasses.replace(first.codec, **_other_param(first.codec))
            forged = dataclasses.replace(
                record, inputs=(dataclasses.replace(first, codec=lie), *record.inputs[1:])
            )
            fcid, data = encode_record(forged, coord)
            assert await auditor.put_block(data, DAG_CBOR) == fcid
            with pytest.raises(AuditError) as info:
                await verify_round(auditor, fcid)
            assert info.value.check == "input-codec"
            # and one that calls a compressed input dense
            dense = dataclasses.replace(
                record,
                inputs=tuple(
                    dataclasses.replace(i, codec=None) if i is first else i for i in record.inputs
                ),
            )
            dcid, data = encode_record(dense, coord)
            await auditor.put_block(data, DAG_CBOR)
            with pytest.raises(AuditError) as info:
                await verify_round(auditor, dcid)
            assert info.value.check == "input-codec"

    asyncio.run(go())


def _other_param(codec: Codec) -> dict[str, Any]:
    if codec.name == "int8":
        return {"block": 2048}
    assert codec.k is not None
    return {"k": codec.k + 1}


def test_compressed_inputs_are_checked_after_decompression() -> None:
    g = compress(Gradient({"w": np.ones((2, 3), np.float32)}), "bf16")
    schema, problem, norm = _check(g, None, clip=True)
    assert schema == (("w", "<f4", (2, 3)),) and problem is None and norm == np.sqrt(6.0)
    # a bfloat16 NaN in a payload (the decoder takes any 16-bit pattern as a value)
    payload = np.array([0x3F80, 0x7FC0, 0, 0, 0, 0], "<u2").view(np.uint8)
    bad = CompressedGradient(g.codec, {"w": CompressedTensor(g.codec, "<f4", (2, 3), payload)})
    assert _check(bad, None, clip=False)[1] == "non-finite: tensor 'w' holds NaN or Inf"
    topk = Codec("topk", chunk=4, k=1, index=12, values="bf16")
    payload = np.array([0x80, 0x7F, 0x00, 0x00], np.uint8)  # bf16 +inf at position 0
    inf = CompressedGradient(topk, {"w": CompressedTensor(topk, "<f4", (4,), payload)})
    assert _check(inf, None, clip=False)[1] == "non-finite: tensor 'w' holds NaN or Inf"
    _, problem, _ = _check(g, (("w", "<f4", (3, 2)),), clip=False)
    assert problem is not None and problem.startswith("schema-mismatch")
