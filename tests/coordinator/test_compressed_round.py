"""A round of compressed inputs across real Kubo daemons, recomputed bit for bit from its
record by the audit tools; a record that lies about a codec is caught; a hostile compressed
input is excluded by name, and verified off the event loop within its budget."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any, cast

import dag_cbor
import numpy as np
import pytest

import gradstore.format._payload as _payload
from gradstore.aggregate import first_beyond_dtype
from gradstore.audit import verify_cid, verify_round
from gradstore.compress import compress
from gradstore.coordinator import ByteBudget, check_gradient, verify_input
from gradstore.coordinator.inputs import SCRATCH_BYTES
from gradstore.dag import DAG_CBOR
from gradstore.errors import AuditError
from gradstore.format import (
    Codec,
    CompressedGradient,
    CompressedTensor,
    Gradient,
    decode_any,
    decode_with_header,
    encode,
    numpy_dtype,
)
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
            assert dag_cbor.decode(block)["type"] == "gradstore/round/4"  # codecs and peer_sig
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
    schema, problem, norm = check_gradient(g, None, clip=True)
    assert schema == (("w", "<f4", (2, 3)),) and problem is None and norm == np.sqrt(6.0)
    # a bfloat16 NaN in a payload (the decoder takes any 16-bit pattern as a value)
    payload = np.array([0x3F80, 0x7FC0, 0, 0, 0, 0], "<u2").view(np.uint8)
    bad = CompressedGradient(g.codec, {"w": CompressedTensor(g.codec, "<f4", (2, 3), payload)})
    assert check_gradient(bad, None, clip=False)[1] == "non-finite: tensor 'w' holds NaN or Inf"
    topk = Codec("topk", chunk=4, k=1, index=12, values="bf16")
    payload = np.array([0x80, 0x7F, 0x00, 0x00], np.uint8)  # bf16 +inf at position 0
    inf = CompressedGradient(topk, {"w": CompressedTensor(topk, "<f4", (4,), payload)})
    assert check_gradient(inf, None, clip=False)[1] == "non-finite: tensor 'w' holds NaN or Inf"
    _, problem, _ = check_gradient(g, (("w", "<f4", (3, 2)),), clip=False)
    assert problem is not None and problem.startswith("schema-mismatch")


# -- issue 23: inputs whose values come back beyond their dtype (R1), and the cost of
# -- verifying a large compressed input (R2) ---------------------------------------------

F32_MAX = float(np.finfo(np.float32).max)

#: (spec, the tensor's dtype): each peer compresses with it; the hostile one then rewrites a
#: scale to float32's largest (int8 values of magnitude 2 or more come back past it), or an
#: fp16 value to 10000 (NaN in float8_e4m3fn, which has no infinity).
BEYOND_CASES = [
    ("int8", "<f4"),
    ("topk:0.05,values=int8", "<f4"),
    ("fp16", "float8_e4m3fn"),
]


def _honest(n: int, code: str) -> list[Gradient]:
    grads = gradients(n, 0)
    if code == "<f4":
        return grads
    dtype = numpy_dtype(code)
    return [Gradient({"w": g.tensors["w"].astype(dtype), "b": g.tensors["b"]}) for g in grads]


def _beyond(g: CompressedGradient) -> CompressedGradient:
    """``g`` with tensor 'w' rewritten so a value decompresses beyond its dtype; every
    decoder rule still holds (the scale stays a finite normal float32)."""
    t = g.tensors["w"]
    payload = t.payload.copy()
    if g.codec.name == "fp16":
        payload.view("<f2")[5] = 1e4
    else:  # int8, topk with int8 values: the first block's (chunk's) scale
        payload[:4] = np.frombuffer(np.float32(F32_MAX).tobytes(), np.uint8)
    tensors = dict(g.tensors)
    tensors["w"] = CompressedTensor(t.codec, t.dtype_code, t.shape, payload)
    return CompressedGradient(g.codec, tensors, dict(g.meta))


@pytest.mark.parametrize(("spec", "code"), BEYOND_CASES)
def test_values_beyond_their_dtype_are_refused_by_name(spec: str, code: str) -> None:
    """The coordinator's check (Flower's too: it verifies CIDs with verify_input) refuses
    what `get` refuses, with the same element check: the decoder accepts the document."""
    ok = compress(_honest(1, code)[0], spec)
    assert check_gradient(ok, None, clip=True)[1] is None
    bad = decode_any(encode(_beyond(ok)).tobytes())
    assert isinstance(bad, CompressedGradient)
    _, problem, norm = check_gradient(bad, None, clip=True)
    assert problem is not None and problem.startswith("out-of-range: tensor 'w': element ")
    assert f"beyond the range of its dtype {code}" in problem and norm is None
    at = int(problem.split("element ")[1].split(" ")[0])
    assert first_beyond_dtype(bad.tensors["w"]) == at  # the check `get` refuses by


@pytest.mark.parametrize(("spec", "code"), BEYOND_CASES)
def test_a_peer_whose_values_overflow_their_dtype_is_excluded_and_the_round_closes(
    kubo_factory: Any, tmp_path: Path, spec: str, code: str
) -> None:
    """Issue 23, R1: the input passed every check, fedavg overflowed and the round failed
    with no culprit named. Now it is refused with its reason; the round closes with the
    other two peers."""
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(3, method="fedavg", quorum=2, deadline_s=30)
    grads: list[Gradient | CompressedGradient] = [compress(g, spec) for g in _honest(3, code)]
    hostile = _beyond(cast(CompressedGradient, grads[2]))
    grads[2] = hostile

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            _, task = start_coordinator(w, tmp_path / "state")
            await wait_subscribed(w)
            told = await publish_all(w, 0, grads, [1, 2, 3], refused=[2])
            assert told[2].startswith("out-of-range: tensor 'w': element "), told
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "closed", outcome
            assert set(outcome.peers) == {peers[0].did, peers[1].did}
            assert dict(outcome.excluded)[peers[2].did].startswith("out-of-range: ")
            record = decode_record(await w.coord_node.get_block(outcome.record), cid=outcome.record)
            (excl,) = record.excluded
            assert excl.peer == peers[2].did and excl.reason.startswith("out-of-range: ")
            agg = await GradientStore(w.coord_node).get(outcome.output)
            assert np.isfinite(agg.tensors["w"].astype(np.float64)).all()
            assert agg.tensors["w"].dtype == numpy_dtype(code)

    asyncio.run(go())


def _large_topk(mib: int, spec: str = "topk:1.0,values=2bit") -> CompressedGradient:
    """A valid ``mib`` MiB topk gradient: one compressed chunk, repeated (the costliest
    payload to check per byte by default: 2-bit values, 12-bit positions, all kept)."""
    one = compress(Gradient({"w": np.linspace(-1, 1, 4096, dtype=np.float32)}), spec)
    t = one.tensors["w"]
    n = (mib << 20) // t.nbytes
    big = CompressedTensor(t.codec, "<f4", (4096 * n,), np.tile(t.payload, n))
    return CompressedGradient(one.codec, {"w": big})


def test_verifying_a_large_compressed_input_holds_at_most_its_scratch() -> None:
    """Issue 23, R2: decoding (every payload rule) and the value checks of a 32 MiB topk
    document each hold at most SCRATCH_BYTES beside it, what verify_input adds to the
    budget (checked whole, this payload cost ~15 times its size: 480 MiB)."""
    doc = encode(_large_topk(32)).tobytes()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        gradient, _ = decode_with_header(doc)
        decoding = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        _, problem, norm = check_gradient(gradient, None, clip=True)
        checking = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert problem is None and norm is not None and norm > 0
    assert decoding <= SCRATCH_BYTES and checking <= SCRATCH_BYTES, (decoding, checking)


def _watch_validation(monkeypatch: pytest.MonkeyPatch, seen: dict[str, Any]) -> list[int]:
    """Make the decoder's payload check wait for three ticks of the event loop (10 s at
    most): they come only if it runs off the loop. Returns the tick counter to advance."""
    ticks = [0]
    real = _payload.validate

    def watched(*args: Any) -> None:
        seen.setdefault("thread", threading.get_ident())
        seen.setdefault("used", seen["budget"].used if "budget" in seen else None)
        start, deadline = ticks[0], time.monotonic() + 10
        while ticks[0] < start + 3 and time.monotonic() < deadline:
            time.sleep(0.002)
        seen.setdefault("ticked", ticks[0] >= start + 3)
        real(*args)

    monkeypatch.setattr(_payload, "validate", watched)
    return ticks


@pytest.mark.parametrize("caller", ["verify_input", "store.get_any", "store.verify", "audit"])
def test_a_large_compressed_input_is_checked_off_the_event_loop(
    kubo: Any, monkeypatch: pytest.MonkeyPatch, caller: str
) -> None:
    """Issue 23, R2: the payload checks ran on the coordinator's event loop (a 128 MiB
    document blocked it for a second). Every verifier now decodes in a thread: the loop
    keeps ticking while a payload is checked, and verify_input counts the check's scratch
    in its budget beside the document."""
    gradient = _large_topk(4)
    seen: dict[str, Any] = {}

    async def go() -> None:
        node = kubo.node()
        try:
            store = GradientStore(node)
            cid = await store.put(gradient)
            ticks = _watch_validation(monkeypatch, seen)
            loop_thread = threading.get_ident()

            async def ticker() -> None:
                while True:
                    ticks[0] += 1
                    await asyncio.sleep(0.001)

            tick = asyncio.create_task(ticker())
            try:
                if caller == "verify_input":
                    budget = ByteBudget(1 << 30)
                    seen["budget"] = budget
                    got = await verify_input(
                        node, store, "did:key:z", cid, 1, expected=None,
                        resolve_timeout_s=10, budget=budget, keep=ByteBudget(0), clip=False,
                    )  # fmt: skip
                    assert seen["used"] == got.nbytes + SCRATCH_BYTES
                    assert budget.used == 0
                elif caller == "store.get_any":
                    assert isinstance(await store.get_any(cid), CompressedGradient)
                elif caller == "store.verify":
                    assert (await store.verify(cid)).cid == cid
                else:
                    assert (await verify_cid(store, cid)).format == "gradstore/2"
            finally:
                tick.cancel()
            assert seen["thread"] != loop_thread and seen["ticked"], seen
        finally:
            await node.aclose()

    asyncio.run(go())
