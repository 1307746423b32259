"""GradientStore over the embedded LocalNode: the same CIDs and checks as over Kubo."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gradstore.compress import compress
from gradstore.dag import CID, file_cid
from gradstore.errors import BlockNotFoundError, IntegrityError, LimitExceededError, NodeError
from gradstore.format import CompressedGradient, Gradient, Limits, encode
from gradstore.node import LocalNode, SupportsCatInto
from gradstore.store import GradientStore, SyncGradientStore

SEED = 20261129


def _gradient(n_floats: int, seed: int = SEED) -> Gradient:
    rng = np.random.default_rng(seed)
    return Gradient(
        {
            "layer1.weight": rng.standard_normal(n_floats, dtype=np.float32).reshape(-1, 4),
            "layer1.bias": rng.standard_normal(4).astype(np.float64),
            "step": np.array(7, dtype="<i8"),
        },
        {"round": 3, "kind": "gradient"},
    )


def test_put_get_round_trip_multi_chunk(tmp_path: Path) -> None:
    g = _gradient(1_000_000)  # ~4 MB: a dag-pb root over raw leaves
    with SyncGradientStore(LocalNode(tmp_path)) as store:
        cid = store.put(g)
        assert cid == file_cid(encode(g)), f"seed {SEED}"
        assert str(cid).startswith("bafybei")
        back = store.get(cid)
        report = store.verify(cid)
    assert back == g
    assert (report.blocks, report.tensors) == (5, 3)  # four 1 MiB leaves and their root
    assert cid in asyncio.run(LocalNode(tmp_path).pins())


def test_sync_get_any_returns_what_was_put_either_kind(tmp_path: Path) -> None:
    dense = Gradient({"w": _gradient(4000).tensors["layer1.weight"]})
    compressed = compress(dense, "int8")
    with SyncGradientStore(LocalNode(tmp_path)) as store:
        back = store.get_any(store.put(compressed))
        plain = store.get_any(store.put(dense))
    assert isinstance(back, CompressedGradient) and back == compressed
    assert isinstance(plain, Gradient) and plain == dense


def test_small_gradient_is_one_raw_block(tmp_path: Path) -> None:
    g = _gradient(16)
    with SyncGradientStore(LocalNode(tmp_path)) as store:
        cid = store.put(g)
        assert str(cid).startswith("bafkrei")
        assert store.get(str(cid)) == g
        report = store.verify(cid)
    assert report.cid == cid and report.blocks == 1 and report.tensors == 3


def test_corrupted_block_is_an_integrity_error_naming_the_cid(tmp_path: Path) -> None:
    g = _gradient(600_000)
    with SyncGradientStore(LocalNode(tmp_path)) as store:
        cid = store.put(g)
        victims = [
            p
            for p in (tmp_path / "blocks").rglob("*")
            if p.is_file() and p.stat().st_size == 1 << 20
        ]
        assert victims, "expected 1 MiB leaf blocks on disk"
        data = bytearray(victims[0].read_bytes())
        data[12345] ^= 0x01
        victims[0].write_bytes(bytes(data))
        with pytest.raises(IntegrityError) as info:
            store.get(cid)
    assert info.value.cid != str(cid)  # the leaf, not the root, is named
    assert info.value.cid in str(info.value)


def test_limit_refuses_before_fetching_everything(tmp_path: Path) -> None:
    g = _gradient(600_000)
    with SyncGradientStore(LocalNode(tmp_path)) as store:
        cid = store.put(g)
        with pytest.raises(LimitExceededError):
            store.get(cid, limits=Limits(max_bytes=1 << 20))


def test_missing_cid_is_not_found(tmp_path: Path) -> None:
    absent = CID.hash(0x55, b"never stored")
    with SyncGradientStore(LocalNode(tmp_path)) as store, pytest.raises(BlockNotFoundError):
        store.get(absent)


def test_unpin(tmp_path: Path) -> None:
    async def go() -> None:
        node = LocalNode(tmp_path)
        store = GradientStore(node)
        cid = await store.put(_gradient(64))
        assert cid in await node.pins()
        await store.unpin(cid)
        assert cid not in await node.pins()

    asyncio.run(go())


class _FailingImports(LocalNode):
    """A local node whose leaf imports break off after a few blocks, as a dying daemon would."""

    async def import_car(self, body, *, pin_roots=True, complete=False):  # type: ignore[no-untyped-def,override]
        if complete:
            return await super().import_car(body, pin_roots=pin_roots, complete=complete)
        seen = 0
        async for piece in body:
            seen += len(piece)
            if seen > 3 << 20:
                raise NodeError("connection reset by the node")
        return []


def test_a_put_that_fails_midway_raises_and_leaves_no_thread_behind(tmp_path: Path) -> None:
    import threading

    g = _gradient(5_000_000)  # ~20 MB: many leaves still queued when the import fails

    async def go() -> None:
        with pytest.raises(NodeError, match="connection reset"):
            await GradientStore(_FailingImports(tmp_path)).put(g)

    asyncio.run(asyncio.wait_for(go(), 30))
    assert not [t for t in threading.enumerate() if t.name == "gradstore-put"]


class _CatIntoNode(LocalNode):
    """A LocalNode that also has the ``SupportsCatInto`` capability, serving given file bytes."""

    def __init__(self, path: Path, files: dict[CID, bytes]) -> None:
        super().__init__(path)
        self.files = files
        self.cat_calls = 0

    @property
    def bulk_reads(self) -> bool:
        return True

    async def cat_into(
        self, cid: CID, out: memoryview, *, progress: Callable[[int], None] | None = None
    ) -> int:
        self.cat_calls += 1
        data = self.files[cid]
        view = memoryview(out).cast("B")
        view[: len(data)] = data
        if progress is not None:
            progress(len(data))
        return len(data)


def test_any_node_with_cat_into_gets_the_cat_path_and_every_byte_is_still_verified(
    tmp_path: Path,
) -> None:
    # The store tests for the capability, not for KuboNode: a non-Kubo node offering cat_into
    # is read through it, and a byte it flips is caught all the same.
    g = _gradient(700_000)  # three leaves under a dag-pb root
    doc = encode(g).tobytes()
    with SyncGradientStore(LocalNode(tmp_path)) as store:
        cid = store.put(g)
    honest = _CatIntoNode(tmp_path, {cid: doc})
    assert isinstance(honest, SupportsCatInto)
    with SyncGradientStore(honest) as store:
        assert store.get(cid) == g
    assert honest.cat_calls == 1
    flipped = bytearray(doc)
    flipped[(1 << 20) + 5] ^= 1  # in the second leaf
    liar = _CatIntoNode(tmp_path, {cid: bytes(flipped)})
    with SyncGradientStore(liar) as store, pytest.raises(IntegrityError):
        store.get(cid)
    assert liar.cat_calls == 1
