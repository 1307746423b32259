"""The model-level document of a stepped round, assembled from the steps' outputs on a node:
the document of every step's tensors, read by ranges in bounded memory, its refusals, and
how many of its blocks are the steps' own (docs/spec.md, section 9.4)."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.compress import compress
from gradstore.dag import CID, RAW, build_file, file_cid
from gradstore.errors import AssemblyError, LimitExceededError
from gradstore.format import Gradient, Limits, encode
from gradstore.messages import model_meta, step_aggregate_meta
from gradstore.node import KuboDaemon, LocalNode, Node
from gradstore.store import GradientStore, model_cid, open_model, put_model
from gradstore.store._assemble import WINDOW

MIB = 1 << 20
MODEL_META = {"kind": "model", "job": "j", "steps": ["a", "b"]}


def step_output(tensors: dict[str, Any], step: str = "s", **meta: Any) -> Gradient:
    return Gradient(tensors, {"kind": "aggregate", "step": step, **meta})


def steps(n: int, rows: int, seed: int = 1, zeros: int = 0) -> list[Gradient]:
    """``n`` step outputs of a (rows, 1000) float32 weight and a bias (the first ``zeros``
    weights all zeros: a layer whose gradient is zero); 1024 rows is about 4 MiB."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        weight = rng.standard_normal((rows, 1000)).astype("<f4")
        if i < zeros:
            weight[:] = 0
        bias = rng.standard_normal(1000).astype("<f4")
        out.append(step_output({f"layer{i}.weight": weight, f"layer{i}.bias": bias}, f"s{i}"))
    return out


def union(outputs: Sequence[Gradient], meta: dict[str, Any]) -> Gradient:
    return Gradient({k: v for g in outputs for k, v in g.tensors.items()}, meta)


async def put_all(node: Node, outputs: Sequence[Gradient]) -> list[CID]:
    store = GradientStore(node)
    return [await store.put(g) for g in outputs]


async def _assembles(node: Node) -> None:
    outputs = [*steps(3, 768), step_output({"a.scalar": np.float32(2.5)}, "t")]
    cids = await put_all(node, outputs)
    want = union(outputs, MODEL_META)
    assert await model_cid(node, cids, MODEL_META) == file_cid(encode(want))
    store = GradientStore(node)
    stored = await put_model(store, cids, MODEL_META)
    assert stored == file_cid(encode(want))
    got = await store.get(stored)
    assert got.meta == MODEL_META and list(got.tensors) == sorted(want.tensors)
    for name, array in want.tensors.items():
        assert got.tensors[name].tobytes() == np.asarray(array).tobytes()


def test_the_model_document_is_the_document_of_every_steps_tensors(tmp_path: Path) -> None:
    asyncio.run(_assembles(LocalNode(tmp_path)))


def test_the_model_document_is_put_on_kubo_and_read_back(kubo: KuboDaemon) -> None:
    async def main() -> None:
        async with kubo.node() as node:
            await _assembles(node)

    asyncio.run(main())


def test_assembling_holds_a_few_windows_not_the_model(tmp_path: Path) -> None:
    """31 MiB of step outputs are hashed into the model's CID holding about 10 MiB: the chunks
    in flight and one read; no piece of the document is larger than a window."""

    async def main() -> None:
        node = LocalNode(tmp_path)
        cids = await put_all(node, steps(8, 1024))
        document = await open_model(node, cids, MODEL_META)
        pieces = await asyncio.to_thread(lambda: [p.nbytes for p in document])
        assert max(pieces) <= WINDOW and sum(pieces) == document.size > 31 * MIB
        tracemalloc.start()
        try:
            await model_cid(node, cids, MODEL_META)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 14 * MIB, f"{peak / MIB:.1f} MiB"

    asyncio.run(main())


def test_held_outputs_are_taken_from_memory_not_read_back(tmp_path: Path) -> None:
    """A coordinator passes the step outputs it holds (what it just stored): none of their
    blocks is read from the node, and the model's CID is the one read back from the node
    gives; outputs it does not hold are read from the node, and a held one is checked."""

    async def main() -> None:
        node = LocalNode(tmp_path)
        outputs = [*steps(3, 300), step_output({"a.bf": np.float64(2.5)}, "t")]
        cids = [file_cid(encode(g)) for g in outputs]  # the first two are never stored
        await put_all(node, outputs[2:])
        held = {cids[0]: outputs[0], cids[1]: outputs[1], cids[3]: outputs[3]}
        want = await model_cid(node, cids, MODEL_META, held=held)
        assert want == file_cid(encode(union(outputs, MODEL_META)))
        assert await put_model(GradientStore(node), cids, MODEL_META, held=held) == want
        with pytest.raises(AssemblyError, match=r"tensor 'layer0\.weight' is in two"):
            await model_cid(node, [cids[0], cids[0]], MODEL_META, held=held)
        wrong = step_output({"x": np.ones(3, "<i4")})
        with pytest.raises(AssemblyError, match="dtype <i4"):
            await model_cid(node, [cids[0]], MODEL_META, held={cids[0]: wrong})
        with pytest.raises(AssemblyError, match="kind None, not"):
            await model_cid(node, [cids[0]], MODEL_META, held={cids[0]: Gradient({"x": w})})

    w = np.ones(3, "<f4")
    asyncio.run(main())


def test_a_tensor_in_two_step_outputs_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        node = LocalNode(tmp_path)
        w = np.ones(3, "<f4")
        cids = await put_all(node, [step_output({"x": w, "y": w}), step_output({"y": w * 2}, "t")])
        with pytest.raises(AssemblyError, match="tensor 'y' is in two step outputs"):
            await model_cid(node, cids, MODEL_META)
        with pytest.raises(AssemblyError, match="in two step outputs"):
            await model_cid(node, [cids[0], cids[0]], MODEL_META)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (Gradient({"x": np.ones(3, "<f4")}, {"kind": "gradient"}), "kind 'gradient', not"),
        (Gradient({"x": np.ones(3, "<f4")}), "kind None, not"),
        (step_output({"x": np.ones(3, "<i4")}), "dtype <i4"),
        (compress(step_output({"x": np.ones(64, "<f4")}), "bf16"), "is compressed"),
    ],
    ids=["another-kind", "no-kind", "not-float", "compressed"],
)
def test_an_output_that_is_not_a_step_aggregate_is_refused(
    tmp_path: Path, document: Any, message: str
) -> None:
    async def main() -> None:
        node = LocalNode(tmp_path)
        good = step_output({"y": np.ones(2, "<f4")}, "t")
        cids = await put_all(node, [good, document])
        with pytest.raises(AssemblyError, match=message):
            await model_cid(node, cids, MODEL_META)

    asyncio.run(main())


def test_a_model_over_the_limits_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        node = LocalNode(tmp_path)
        cids = await put_all(node, steps(2, 10))
        with pytest.raises(LimitExceededError, match="max_bytes"):
            await model_cid(node, cids, MODEL_META, limits=Limits(max_bytes=60_000))

    asyncio.run(main())


def test_the_document_is_read_off_its_event_loop(tmp_path: Path) -> None:
    async def main() -> None:
        node = LocalNode(tmp_path)
        document = await open_model(node, await put_all(node, steps(1, 10)), MODEL_META)
        with pytest.raises(RuntimeError, match="another thread"):
            document.tobytes()  # on the loop, its reads could never run

    asyncio.run(main())


def _leaves(gradient: Gradient) -> list[CID]:
    return [b.cid for b in build_file(encode(gradient)) if b.cid.codec == RAW]


def _realistic(outputs: Sequence[Gradient]) -> tuple[list[Gradient], Gradient]:
    """``outputs`` with the metas a coordinator writes (three inputs a step), and the model."""
    rng = np.random.default_rng(8)
    run = "r" * 24
    named = []
    for i, g in enumerate(outputs):
        inputs = [CID.hash(RAW, rng.bytes(8)) for _ in range(3)]
        meta = step_aggregate_meta("job", 3, f"s{i}", "fedavg", inputs, run=run)
        named.append(Gradient(g.tensors, meta))
    cids = [file_cid(encode(g)) for g in named]
    meta = model_meta("job", 3, [f"s{i}" for i in range(len(named))], cids, run=run)
    return named, union(named, meta)


@pytest.mark.parametrize(("zeros", "shared"), [(0, 0), (2, 5)])
def test_the_model_shares_only_chunks_of_the_same_bytes_with_its_steps(
    zeros: int, shared: int
) -> None:
    """8 steps of about 4 MiB (the figures in docs/spec.md, section 9.4): no leaf of the
    model is a step output's, its data sitting at other offsets from the chunk boundaries;
    with two all-zero layers, the model's all-zero chunks are theirs (one block)."""
    outputs, model = _realistic(steps(8, 1024, zeros=zeros))
    step_leaves = {cid for g in outputs for cid in _leaves(g)}
    leaves = _leaves(model)
    assert len(leaves) == 32
    common = [cid for cid in leaves if cid in step_leaves]
    assert len(common) == shared
    assert set(common) <= {CID.hash(RAW, bytes(MIB))}  # the all-zero chunk, if any


def test_chunks_at_the_same_offsets_are_shared() -> None:
    """What sharing takes: the first step's data at the offsets it has in the model document
    (their headers pad to the same 64 bytes), so whole chunks of it are the same bytes."""
    outputs = steps(8, 1024)
    step_leaves = {cid for g in outputs for cid in _leaves(g)}
    model = _leaves(union(outputs, {"kind": "model"}))
    first = _leaves(outputs[0])
    assert first[1:3] == model[1:3]  # the first step's whole chunks after its header's
    assert sum(cid in step_leaves for cid in model) == 2
