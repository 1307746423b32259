"""The conformance vectors in tests/vectors: every one audits, says truly what it covers, and
together they cover every method, dtype, codec and record version, stepped rounds' round/5
and step records included, with a step whose inputs are compressed and one whose inputs and
output span several blocks (tests/vectors/README.md)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gradstore.aggregate.methods import REGISTRY
from gradstore.audit import SteppedRoundReport, verify_history, verify_round
from gradstore.cli import main as gradstore_main
from gradstore.dag import CID, RAW, CarReader, block_links, write_car
from gradstore.dag.block import Block
from gradstore.errors import AuditError, IntegrityError
from gradstore.format import CODECS, FLOATS, VALUE_FORMATS
from gradstore.format.codecs import INDEX_BITS
from gradstore.messages import RECORD_TYPE_STEPPED, RECORD_TYPES, STEP_RECORD_TYPE
from gradstore.node import KuboDaemon, LocalNode, Node

from .vector_features import describe, step_outputs

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "tests" / "vectors"
DOCUMENT = json.loads((VECTORS / "vectors.json").read_text("utf-8"))
BY_NAME = {v["name"]: v for v in DOCUMENT["vectors"]}

#: What the vectors must show besides every method, dtype and codec (vector_features.tags).
REQUIRED_TAGS = frozenset(
    {
        "odd-count",
        "even-count",
        "clip-input",
        "clip-output",
        "norm-sum-changes-output",
        "negative-zero",
        "all-negative-zero",
        "mixed-signed-zeros",
        "krum-tie",
        "multi-block",
        "excluded",
        "prev",
        "compressed",
        "mixed-codecs",
        "mixed-dtypes",
        "scalar-tensor",
        "empty-tensor",
        "failed-step",
        "mixed-methods",
        "compressed-step",
        "multi-block-step",
        "multi-block-model",
    }
)


def aggregations(vector: dict[str, Any]) -> list[dict[str, Any]]:
    """The covers of each aggregation a vector holds: its round's, or its closed steps'."""
    covers = vector["covers"]
    if covers["record_type"] != RECORD_TYPE_STEPPED:
        return [covers]
    return [c for c in covers["steps"] if "failed" not in c]


def closed_steps(vector: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in vector.get("steps", []) if "failed" not in s]


def car_pieces(path: Path, size: int = 1 << 16) -> Iterator[bytes]:
    with path.open("rb") as f:
        while piece := f.read(size):
            yield piece


async def load(node: Node, vector: dict[str, Any]) -> CID:
    """Import the vector's CAR; its one root must be the record vectors.json names."""
    roots = await node.import_car(car_pieces(VECTORS / vector["car"]))
    assert [str(r) for r in roots] == [vector["record"]]
    return roots[0]


async def check(node: Node, vector: dict[str, Any]) -> None:
    """What an auditor does with a vector: audit the round with the coordinator pinned, and
    compare the output CID the audit re-derived (it equals the record's) with vectors.json."""
    report = await verify_round(node, vector["record"], coordinator=vector["coordinator"])
    if str(report.record.output) != vector["output"]:
        raise AuditError(
            "expected-output",
            f"{vector['name']}: the round re-derives {report.record.output}, "
            f"vectors.json expects {vector['output']}",
        )
    assert report.record.type == vector["record_type"]
    if isinstance(report, SteppedRoundReport):  # each step re-derived, as vectors.json says
        steps = closed_steps(vector)
        assert [(s.record.step, str(s.record_cid), str(s.record.output)) for s in report.steps] == [
            (s["step"], s["record"], s["output"]) for s in steps
        ]
        assert [[str(i.gradient) for i in s.record.inputs] for s in report.steps] == [
            [i["cid"] for i in s["inputs"]] for s in steps
        ]
        failed = [(s["step"], s["failed"]) for s in vector["steps"] if "failed" in s]
        assert list(report.failed) == failed
        return
    assert [str(i.gradient) for i in report.record.inputs] == [i["cid"] for i in vector["inputs"]]


def car_blocks(path: Path) -> tuple[list[CID], list[Block]]:
    reader = CarReader()
    blocks = reader.feed(path.read_bytes())
    reader.close()
    assert reader.roots is not None
    return reader.roots, blocks


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_vector_audits_and_gives_its_expected_output(tmp_path, name):
    vector = BY_NAME[name]

    async def main() -> None:
        node = LocalNode(tmp_path)
        await load(node, vector)
        await check(node, vector)
        if vector["history"]:  # a chain: every round before it audits too, from the same CAR
            reports = await verify_history(
                node, vector["record"], coordinator=vector["coordinator"]
            )
            outputs = [str(r.record.output) for r in reports[1:]]
            assert outputs == [h["output"] for h in vector["history"]]

    asyncio.run(main())


def test_the_audit_command_passes_on_an_imported_vector(tmp_path, capsys):
    """The README's steps through the CLI: import the CAR, audit with the coordinator pinned."""
    vector = BY_NAME["chain-two-rounds"]
    asyncio.run(load(LocalNode(tmp_path), vector))
    for command in ("round", "history"):
        code = gradstore_main(
            [
                *("audit", command, vector["record"], "--local", str(tmp_path)),
                *("--coordinator", vector["coordinator"]),
            ]
        )
        out, err = capsys.readouterr()
        assert code == 0, out + err
        assert vector["output"] in out


@pytest.mark.parametrize("name", ["multiblock-mean-clip", "codec-mixed-median", "steps-multiblock"])
def test_a_vector_imported_into_kubo_audits_there(kubo: KuboDaemon, name):
    vector = BY_NAME[name]

    async def main() -> None:
        async with kubo.node() as node:
            await load(node, vector)
            await check(node, vector)

    asyncio.run(main())


def _step_inputs(vector: dict[str, Any]) -> list[dict[str, Any]]:
    """The inputs of a stepped round's first step whose first input spans several blocks,
    else of its last step."""
    steps = closed_steps(vector)
    several = [s for s in steps if CID.parse(s["inputs"][0]["cid"]).codec != RAW]
    inputs: list[dict[str, Any]] = (several or steps[-1:])[0]["inputs"]
    return inputs


def _input_leaf(vector: dict[str, Any], blocks: list[Block]) -> Block:
    """A raw leaf of the first input document (the document itself when it is one block, else
    its last leaf); of a stepped round, that of ``_step_inputs``."""
    inputs = _step_inputs(vector) if "steps" in vector else vector["inputs"]
    first = CID.parse(inputs[0]["cid"])
    if first.codec == RAW:
        return next(b for b in blocks if b.cid == first)
    root = next(b for b in blocks if b.cid == first)
    leaf = block_links(root)[-1]
    return next(b for b in blocks if b.cid == leaf)


@pytest.mark.parametrize(
    "name", ["method-median", "multiblock-mean-clip", "steps-three-methods", "steps-multiblock"]
)
def test_a_flipped_byte_in_an_input_block_fails(tmp_path, name):
    """A CAR whose input block was altered is refused on import; the same block altered on
    the auditor's disk fails the audit naming the input."""
    vector = BY_NAME[name]
    roots, blocks = car_blocks(VECTORS / vector["car"])
    leaf = _input_leaf(vector, blocks)
    flipped = bytearray(leaf.data)
    flipped[len(flipped) // 2] ^= 0x01
    tampered = [Block(b.cid, bytes(flipped)) if b.cid == leaf.cid else b for b in blocks]

    async def main() -> None:
        bad = LocalNode(tmp_path / "import")
        with pytest.raises(IntegrityError):
            await bad.import_car(write_car(roots, tampered))
        node = LocalNode(tmp_path / "disk")
        await load(node, vector)
        await check(node, vector)  # intact: passes
        (node.blocks_dir / str(leaf.cid)).write_bytes(bytes(flipped))
        with pytest.raises(AuditError) as failed:
            await check(node, vector)
        assert failed.value.check.startswith("input-")

    asyncio.run(main())


def test_a_flipped_byte_in_the_record_fails(tmp_path):
    """Refused on import, and named ``record-hash`` when a node serves it (was IntegrityError,
    no check named)."""
    vector = BY_NAME["method-fedavg"]
    roots, blocks = car_blocks(VECTORS / vector["car"])
    record = next(b for b in blocks if b.cid == roots[0])
    flipped = bytearray(record.data)
    flipped[-1] ^= 0x01
    tampered = [Block(record.cid, bytes(flipped)), *(b for b in blocks if b is not record)]

    async def main() -> None:
        with pytest.raises(IntegrityError):
            await LocalNode(tmp_path / "import").import_car(write_car(roots, tampered))
        node = LocalNode(tmp_path / "disk")
        await load(node, vector)
        (node.blocks_dir / str(record.cid)).write_bytes(bytes(flipped))
        with pytest.raises(AuditError) as failed:
            await check(node, vector)
        assert failed.value.check == "record-hash"

    asyncio.run(main())


def test_a_changed_expected_output_or_coordinator_fails(tmp_path):
    vector = BY_NAME["krum-tie"]
    other = BY_NAME["multikrum-boundary-tie"]

    async def main() -> None:
        node = LocalNode(tmp_path)
        await load(node, vector)
        with pytest.raises(AuditError) as failed:
            await check(node, {**vector, "output": other["output"]})
        assert failed.value.check == "expected-output"
        impostor = "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"
        with pytest.raises(AuditError) as failed:
            await check(node, {**vector, "coordinator": impostor})
        assert failed.value.check == "expected-coordinator"

    asyncio.run(main())


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_vectors_json_says_what_each_car_holds(tmp_path, name):
    """``covers`` and ``output_tensors`` are derived again from the CAR's blocks: vectors.json
    cannot claim a feature (a tie, a signed zero, a codec) that its vector does not have."""
    vector = BY_NAME[name]

    async def main() -> None:
        node = LocalNode(tmp_path)
        record = await load(node, vector)
        covers, output_tensors = await describe(node, record)
        assert covers == vector["covers"]
        assert output_tensors == vector["output_tensors"]
        if vector["record_type"] == RECORD_TYPE_STEPPED:
            outputs = await step_outputs(node, record)
            assert outputs == {s["step"]: s["output_tensors"] for s in closed_steps(vector)}

    asyncio.run(main())


def test_the_vectors_cover_every_method_dtype_codec_and_record_version():
    """Adding a method, dtype, codec or record version without a vector fails here."""
    rounds = [v["covers"] for v in DOCUMENT["vectors"]]
    covers = [c for v in DOCUMENT["vectors"] for c in aggregations(v)]
    params = [p for c in covers for p in c["codec_params"]]
    assert {c["method"] for c in covers} >= set(REGISTRY)
    assert {d for c in covers for d in c["dtypes"]} >= set(FLOATS)
    assert {n for c in covers for n in c["codecs"]} >= {*CODECS, "dense"}
    assert {p["values"] for p in params if p["name"] == "topk"} >= set(VALUE_FORMATS)
    assert {p["index"] for p in params if p["name"] == "topk"} >= set(INDEX_BITS)
    versions = {c["record_type"] for c in [*rounds, *covers]}
    assert versions >= {*RECORD_TYPES, RECORD_TYPE_STEPPED, STEP_RECORD_TYPE}
    assert {t for c in [*rounds, *covers] for t in c["tags"]} >= REQUIRED_TAGS
    for method in ("median", "trimmed_mean"):  # both parities of the order statistics
        assert {c["count"] for c in covers if c["method"] == method} == {"even", "odd"}
    cars = sorted(p.name for p in VECTORS.glob("*.car"))
    assert cars == sorted(v["car"] for v in DOCUMENT["vectors"])  # no CAR left unlisted
    assert {v["coordinator"] for v in DOCUMENT["vectors"]} == {DOCUMENT["coordinator"]}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "scripts/make_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_regenerating_the_vectors_gives_the_same_bytes(capsys):
    code = _generator().main(["--check", "--out", str(VECTORS)])
    assert code == 0, capsys.readouterr().err
