"""The demo with compressed updates: deltas (federated) and gradients (data-parallel), round/3
records the audit re-derives, and far fewer bytes stored."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import dag_cbor
import pytest

from gradstore.cli import main
from gradstore.demo import DemoConfig, DemoResult, digits_split, format_row, run_demo, summary
from gradstore.demo._report import format_bytes
from gradstore.format import decode_any
from gradstore.messages import decode_record
from gradstore.node import LocalNode
from gradstore.store import GradientStore

SEED = 5


@pytest.mark.parametrize("mode", ["federated", "data-parallel"])
def test_compressed_demo_sends_compressed_updates_and_audits(tmp_path: Path, mode: str) -> None:
    node = LocalNode(tmp_path / "node")
    spec = "topk:0.027,values=2bit"  # what the docs recommend for the demo
    rounds = 3

    async def go() -> tuple[object, object]:
        data = digits_split(3, SEED)
        plain = await run_demo(DemoConfig(peers=3, rounds=rounds, mode=mode, seed=SEED), node, data)
        packed = await run_demo(
            DemoConfig(peers=3, rounds=rounds, mode=mode, seed=SEED, compress=spec),
            node,
            data,
        )
        return plain, packed

    plain, packed = asyncio.run(go())
    stored = [sum(r.input_bytes for r in res.rows) for res in (plain, packed)]  # type: ignore[attr-defined]
    assert stored[1] * 50 < stored[0], stored  # the default model: issue 11's 50x

    async def inspect() -> None:
        last = packed.rows[-1]  # type: ignore[attr-defined]
        block = await node.get_block(last.record)
        assert dag_cbor.decode(block)["type"] == "gradstore/round/4"
        record = decode_record(block, cid=last.record)
        store = GradientStore(node)
        for i in record.inputs:
            assert i.codec is not None and str(i.codec).startswith("topk:")
            doc = decode_any(await store.fetch_document(i.gradient))
            assert doc.meta["kind"] == ("delta" if mode == "federated" else "gradient")

    asyncio.run(inspect())
    head = packed.rows[-1].record  # type: ignore[attr-defined]
    assert main(["audit", "history", str(head), "--local", str(tmp_path / "node")]) == 0


@pytest.mark.parametrize("spec", [None, "topk:0.027,values=2bit"])
def test_each_byte_figure_counts_what_its_name_says(tmp_path: Path, spec: str | None) -> None:
    """``inputs``/``input_bytes``: the input documents the round's record names, as stored;
    ``traffic``/``traffic_bytes``: those put and fetched once each, and the aggregate put
    once and fetched by every peer (issue 24: one name, "moved", was both: 2.5x and 57x)."""
    node, peers = LocalNode(tmp_path / "node"), 3
    config = DemoConfig(peers=peers, rounds=2, seed=SEED, compress=spec)

    async def go() -> tuple[DemoResult, list[tuple[list[int], int]]]:
        result = await run_demo(config, node, digits_split(peers, SEED))
        store, sizes = GradientStore(node), []
        for row in result.rows:
            record = decode_record(await node.get_block(row.record), cid=row.record)
            docs = [len(await store.fetch_document(i.gradient)) for i in record.inputs]
            sizes.append((docs, len(await store.fetch_document(record.output))))
        return result, sizes

    result, sizes = asyncio.run(go())
    for row, (inputs, aggregate) in zip(result.rows, sizes, strict=True):
        assert len(inputs) == peers
        assert row.input_bytes == sum(inputs)
        assert row.traffic_bytes == 2 * sum(inputs) + (peers + 1) * aggregate
        cells = format_row(row).split()
        assert cells[-5:-1] == [
            *format_bytes(row.input_bytes).split(),
            *format_bytes(row.traffic_bytes).split(),
        ]
    data = summary(result)
    assert data["input_bytes"] == sum(sum(i) for i, _ in sizes)
    assert data["traffic_bytes"] == sum(r.traffic_bytes for r in result.rows)
    assert "bytes_moved" not in data  # the name both figures went by


def test_demo_command_reports_input_and_traffic_bytes_and_the_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = tmp_path / "s.json"
    code = main([
        "demo", "--local", str(tmp_path / "node"), "--peers", "2", "--rounds", "2", "--quiet",
        "--compress", "int8", "--summary-json", str(summary),
    ])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    job_line = next(line for line in out.splitlines() if line.startswith("job:"))
    assert "compressed with int8" in job_line
    data = json.loads(summary.read_text())
    assert data["compress"] == "int8" and data["accuracy"] > 0.5
    assert data["traffic_bytes"] > data["input_bytes"] > 0


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--compress", "zstd"], "unknown codec"),
        (["--model", "softmax", "--hidden", "8"], "mlp setting"),
    ],
)
def test_bad_compression_and_model_options(
    argv: list[str], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--local", "/nonexistent", *argv]) == 2
    assert match in capsys.readouterr().err
