"""An audit reads its inputs back from its own spill files (the bytes it just verified),
not from the node, and gives the same verdict; where a spill would not fit on the disk, it
reads the node back by ranges read ahead. Real Kubo: its fetch hands the verified bytes over
as they come."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gradstore.audit._checks as checks
from gradstore.audit import verify_round
from gradstore.format import Gradient
from gradstore.node import KuboDaemon
from gradstore.store import StoredDocument

from .rounds import COORDINATOR, signed_round

pytestmark = pytest.mark.kubo


def _gradients() -> list[Gradient]:
    rng = np.random.default_rng(21)
    return [Gradient({"w": rng.standard_normal((600, 700)).astype(np.float32)}) for _ in range(4)]


def _no_node_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an input was read back from the node")

    monkeypatch.setattr(StoredDocument, "open", refuse)


@pytest.mark.parametrize("method", ["fedavg", "trimmed_mean"])
def test_an_audit_reads_its_spill_files_not_the_node(
    kubo: KuboDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    extra = {"trim_ratio": 0.25} if method == "trimmed_mean" else {}
    codecs = [None, "topk:0.05", "int8:1024", "bf16"]

    async def go() -> None:
        async with kubo.node() as node:
            made = await signed_round(
                node, _gradients(), [3, 1, 4, 1], method, codecs=codecs, **extra
            )
            _no_node_reads(monkeypatch)
            report = await verify_round(node, made.record_cid, coordinator=COORDINATOR.did)
            assert report.inputs == 4

    # a temporary folder of this test's own: other processes' audits may use the real one
    monkeypatch.setattr(checks.tempfile, "tempdir", str(tmp_path))
    asyncio.run(go())
    assert not list(tmp_path.glob("gradstore-audit-*"))  # the spill folder went with the audit


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The CIDs the audit opens on the node to read back, in order."""
    opened: list[object] = []
    real = StoredDocument.open

    async def counting(*args: Any, **kwargs: Any) -> StoredDocument:
        opened.append(args[1])
        return await real(*args, **kwargs)

    monkeypatch.setattr(StoredDocument, "open", counting)
    return opened


def test_an_audit_without_room_for_spills_reads_the_node(
    kubo: KuboDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        async with kubo.node() as node:
            made = await signed_round(node, _gradients(), [3, 1, 4, 1])
            monkeypatch.setattr(checks, "free_space", lambda _: 1 << 30)  # < max + reserve
            opened = _counting(monkeypatch)
            report = await verify_round(node, made.record_cid, coordinator=COORDINATOR.did)
            assert report.inputs == 4 and len(opened) == 4

    asyncio.run(go())
