"""Spill files: the coordinator aggregates verified inputs from the bytes it wrote while
verifying them, with the bits of reading them back from its node, for every method and
codec; files go when the round is over, a start deletes a crash's, and an input whose
spill would not fit on its disk is read back from the node instead (nothing is written)."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import METHODS
from gradstore.compress import compress
from gradstore.coordinator import ByteBudget, verify_input
from gradstore.coordinator.closing import close_round
from gradstore.coordinator.inputs import VerifiedInput
from gradstore.coordinator.spill import SpillDir, SpillTarget, SpillWriter, fits, spill_dir_for
from gradstore.dag import CID
from gradstore.format import CompressedGradient, Gradient
from gradstore.node import KuboDaemon
from gradstore.store import GradientStore

from .harness import make_job, publish_all, start_coordinator, wait_subscribed, world

pytestmark = pytest.mark.kubo

N = 7  # krum and multikrum with byzantine=1 need 5
EXTRAS: dict[str, dict[str, Any]] = {
    "trimmed_mean": {"trim_ratio": 0.2},
    "krum": {"byzantine": 1},
    "multikrum": {"byzantine": 1, "select": 3},
}
SPECS = ["topk:0.02,values=int8", "int8:1024", "bf16", "fp16", None, "topk:0.05", None]


def _inputs(compressed: bool) -> list[Gradient | CompressedGradient]:
    """Seven inputs of two tensors (1.3 MiB: several leaves each); compressed ones mix codecs."""
    rng = np.random.default_rng(2121)
    grads: list[Gradient | CompressedGradient] = []
    for i in range(N):
        g = Gradient(
            {
                "w": rng.standard_normal((560, 600)).astype(np.float32),
                "b": rng.standard_normal(1000).astype(np.float32),
            }
        )
        spec = SPECS[i] if compressed else None
        grads.append(g if spec is None else compress(g, spec))
    return grads


async def _verified(
    kubo: KuboDaemon, spills: SpillDir, grads: list[Gradient | CompressedGradient]
) -> list[VerifiedInput]:
    """Each input stored on ``kubo``, then verified as the coordinator does, spilled."""
    config, _, peers = make_job(N)
    async with kubo.node() as node:
        store = GradientStore(node, limits=config.limits)
        out = []
        for key, g in zip(peers, grads, strict=True):
            cid = await store.put(g)
            out.append(
                await verify_input(
                    node,
                    store,
                    key.did,
                    cid,
                    1 + len(out),
                    expected=None,
                    resolve_timeout_s=10,
                    budget=ByteBudget(256 << 20),
                    keep=ByteBudget(0),  # nothing kept in memory: spilled, or read back
                    clip=False,
                    spill=SpillTarget(spills, 0, spills.path(0, key.did, None)),
                )
            )
        return out


@pytest.mark.parametrize("compressed", [False, True], ids=["dense", "compressed"])
def test_spilled_inputs_aggregate_to_the_cids_of_reading_them_back_from_the_node(
    kubo: KuboDaemon, tmp_path: Path, compressed: bool
) -> None:
    spills = SpillDir(tmp_path / "spill")
    grads = _inputs(compressed)

    async def go() -> None:
        verified = await _verified(kubo, spills, grads)
        assert all(v.spill is not None and v.spill.stat().st_size == v.nbytes for v in verified)
        from_node = [dataclasses.replace(v, spill=None) for v in verified]
        async with kubo.node() as node:
            for method in METHODS:
                agg: dict[str, Any] = dict(EXTRAS.get(method, {}))
                if method == "weighted":
                    agg["weights"] = {v.peer: float(i + 1) for i, v in enumerate(verified)}
                config, coord, _ = make_job(N, method=method, **agg)
                store = GradientStore(node, limits=config.limits)
                signed = {v.peer: (1, b"\x01" * 64) for v in verified}
                outputs: dict[str, CID] = {}
                for way, inputs in (("spill", verified), ("node", from_node)):
                    closed = await close_round(
                        config,
                        coord,
                        node,
                        store,
                        run="spilltest0",
                        round_=0,
                        inputs=inputs,
                        excluded=[],
                        prev=None,
                        announcements=signed,
                    )
                    assert closed.stats["spilled_inputs"] == (N if way == "spill" else 0)
                    # read back from the node: by ranges read ahead (ReadAhead), every leaf hashed
                    assert (closed.stats["read_requests"] > 0) == (way == "node")
                    outputs[way] = closed.output
                assert outputs["spill"] == outputs["node"], method

    asyncio.run(go())


def test_a_round_reads_its_inputs_from_spill_files_and_deletes_them_when_recorded(
    kubo_factory: Any, tmp_path: Path
) -> None:
    """A whole round, spilled and not: the same aggregate; the spill folder is empty after."""
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(4, method="median")
    grads = [g for g in _inputs(False)[:4] if isinstance(g, Gradient)]
    outputs = []

    async def go(spill: bool, state: Path) -> None:
        async with world(daemons, config, coord, peers) as w:
            _, task = start_coordinator(w, state, keep_bytes=0, spill=spill)
            await wait_subscribed(w)
            await publish_all(w, 0, grads, [1, 2, 3, 4])
            (outcome,) = await asyncio.wait_for(task, 60)
            assert outcome.status == "closed", outcome
            assert outcome.stats["spilled_inputs"] == (4 if spill else 0)
            got = await GradientStore(w.coord_node).get(outcome.output)
            outputs.append({k: v.tobytes() for k, v in got.tensors.items()})

    asyncio.run(go(True, tmp_path / "spilled"))
    assert list((tmp_path / "spilled" / "spill").iterdir()) == []  # the round's folder went
    asyncio.run(go(False, tmp_path / "read-back"))
    assert not (tmp_path / "read-back" / "spill").exists()
    assert outputs[0] == outputs[1]  # the same bits (the CIDs differ: each run has its id)


def test_a_spill_that_would_not_fit_is_not_written_and_the_input_is_read_back(
    kubo: KuboDaemon, tmp_path: Path
) -> None:
    """Free space (faked: a disk cannot be filled here) short of an input and the reserve:
    nothing is written, the input is verified and read back from the node."""
    grads = _inputs(False)[:1]
    size_free = 5 << 20  # the document is 1.3 MiB: it fits, but not with a 4 MiB reserve
    tight = SpillDir(tmp_path / "tight", reserve_bytes=4 << 20, free=lambda _: size_free)
    roomy = SpillDir(tmp_path / "roomy", reserve_bytes=3 << 20, free=lambda _: size_free)

    async def go() -> None:
        (short,) = await _verified_one(kubo, tight, grads[0])
        (fine,) = await _verified_one(kubo, roomy, grads[0])
        assert short.spill is None and fine.spill is not None
        assert list(tight.folder(0).iterdir()) == []
        assert tight.skipped == 1 and tight.writing == 0 and roomy.writing == 0

    asyncio.run(go())


async def _verified_one(
    kubo: KuboDaemon, spills: SpillDir, grad: Gradient | CompressedGradient
) -> list[VerifiedInput]:
    config, _, peers = make_job(N)
    async with kubo.node() as node:
        store = GradientStore(node, limits=config.limits)
        cid = await store.put(grad)
        did = peers[0].did
        got = await verify_input(
            node,
            store,
            did,
            cid,
            1,
            expected=None,
            resolve_timeout_s=10,
            budget=ByteBudget(256 << 20),
            keep=ByteBudget(0),
            clip=False,
            spill=SpillTarget(spills, 0, spills.path(0, did, None)),
        )
        return [got]


def test_an_input_is_written_to_its_spill_file_and_one_that_cannot_be_is_read_back(
    kubo: KuboDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spill file holds exactly the bytes verified, written by ``SpillWriter`` from the
    fetch's buffer; a file that cannot be written (a full disk, faked: one cannot be filled
    here) leaves the input verified in memory and read back from the node, its file gone."""
    grad = _inputs(False)[0]
    spills = SpillDir(tmp_path / "spill")
    made: list[int] = []
    allocate = SpillWriter.allocate

    def watched(self: SpillWriter, size: int) -> memoryview:
        view = allocate(self, size)
        made.append(size if self.error is None else -size)
        return view

    monkeypatch.setattr(SpillWriter, "allocate", watched)

    async def go() -> None:
        (fine,) = await _verified_one(kubo, spills, grad)
        assert fine.spill is not None and made == [fine.nbytes]
        async with kubo.node() as node:
            document = await GradientStore(node).fetch_document(fine.cid)
        assert fine.spill.read_bytes() == document.tobytes()

        def full(fd: int, data: object, offset: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full)
        full_disk = SpillDir(tmp_path / "full")
        (short,) = await _verified_one(kubo, full_disk, grad)
        assert short.spill is None and made[1] == short.nbytes
        assert list(full_disk.folder(0).iterdir()) == []  # its file went
        assert spills.writing == 0 and full_disk.writing == 0

    asyncio.run(go())


def test_fits_counts_the_reserve_and_the_spills_being_written() -> None:
    assert fits(10, free=30, writing=0, reserve=20)
    assert not fits(10, free=30, writing=1, reserve=20)
    assert not fits(11, free=30, writing=0, reserve=20)


def test_a_coordinator_spills_to_its_state_unless_given_a_folder_or_told_not_to(
    tmp_path: Path,
) -> None:
    got = spill_dir_for(True, tmp_path)
    assert got is not None and got.root == tmp_path
    told = SpillDir(tmp_path / "fast")
    assert spill_dir_for(told, tmp_path) is told
    assert spill_dir_for(False, tmp_path) is None
