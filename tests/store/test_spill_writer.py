"""SpillWriter: a spilled document is written from the fetch's buffer as its prefix is
verified, around the page cache, and the file holds exactly the document's bytes."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from gradstore.format import Gradient
from gradstore.node import KuboDaemon
from gradstore.store import GradientStore, SpillWriter
from gradstore.store._spilled import DIRECT_ALIGN, WRITE_STEP

MIB = 1 << 20


def _cached_bytes(path: Path) -> int:
    """How many of the file's bytes are in the page cache (``mincore`` of a mapping of it)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, np.uint8)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        failed = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec)
        del view
    if failed:
        pytest.skip(f"mincore: {os.strerror(ctypes.get_errno())}")
    return sum(v & 1 for v in vec) * mmap.PAGESIZE


def _file_system(path: Path) -> str:
    """The type of the file system ``path`` is on (the longest mount point above it)."""
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1].replace("\\040", " ")
        if str(path.resolve()).startswith(point.rstrip("/") + "/") and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def _direct_io(folder: Path) -> bool:
    """Whether ``folder``'s file system takes O_DIRECT (else the writer's plain writes), and
    keeps its files on a disk (a tmpfs takes O_DIRECT since Linux 6.6, in memory all the same)."""
    if _file_system(folder) in ("tmpfs", "ramfs", "devtmpfs"):
        pytest.skip(f"{folder}: a file system in memory (its files are page-cache pages)")
    try:
        fd = os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            pytest.skip(f"{folder}: no direct I/O on this file system")
        raise
    os.close(fd)
    return True


def _spill(path: Path, data: bytes, steps: list[int]) -> SpillWriter:
    writer = SpillWriter(path)
    buf = writer.allocate(len(data))
    buf[:] = data
    for prefix in steps:
        writer.verified(prefix)
    return writer


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 5 * MIB + 3, WRITE_STEP + 5, 3 * WRITE_STEP])
def test_the_file_holds_exactly_the_documents_bytes(tmp_path: Path, size: int) -> None:
    data = np.random.default_rng(size).bytes(size)
    writer = _spill(tmp_path / "a.doc", data, list(range(0, size + 1, 1 << 20)))
    assert writer.finish() and writer.kept and writer.error is None
    assert (tmp_path / "a.doc").read_bytes() == data


def test_the_verified_prefix_is_written_while_the_rest_arrives(tmp_path: Path) -> None:
    """Not all at the end: once WRITE_STEP bytes are verified they are on their way to disk,
    the next step only when WRITE_STEP more are (aligned, as direct I/O needs)."""
    size = 3 * WRITE_STEP
    data = np.random.default_rng(1).bytes(size)
    path = tmp_path / "b.doc"
    writer = _spill(path, data, [WRITE_STEP - 1])
    assert path.stat().st_size == 0
    writer.verified(WRITE_STEP + 123)
    assert path.stat().st_size == WRITE_STEP
    assert path.read_bytes() == data[:WRITE_STEP]
    writer.verified(WRITE_STEP + 4096 * 3)  # under a step more: nothing
    assert path.stat().st_size == WRITE_STEP
    assert writer.finish() and path.read_bytes() == data


def test_a_large_document_goes_around_the_page_cache(tmp_path: Path) -> None:
    """The spill is read once, and a new page-cache page is what a spilled byte costs most
    here: a document in mapped memory (over 4 MiB) is written with O_DIRECT, and none of its
    file's pages are in the page cache afterwards."""
    data = np.random.default_rng(2).bytes(2 * WRITE_STEP + 777)
    path = tmp_path / "c.doc"
    writer = _spill(path, data, [WRITE_STEP, 2 * WRITE_STEP])
    assert writer.finish()
    assert writer.direct or not _direct_io(tmp_path)
    assert _cached_bytes(path) < 2 * DIRECT_ALIGN  # at most the tail page's
    assert path.read_bytes() == data


def test_a_file_that_cannot_be_made_leaves_the_buffer_and_says_why(tmp_path: Path) -> None:
    writer = SpillWriter(tmp_path / "missing" / "d.doc")
    buf = writer.allocate(10 * MIB)
    buf[:3] = b"abc"  # the fetch goes on in memory
    writer.verified(10 * MIB)
    assert not writer.finish() and isinstance(writer.error, FileNotFoundError)
    assert bytes(buf[:3]) == b"abc"


def test_a_full_disk_ends_the_spill_not_the_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (no space: direct writes say so, a full mapping was a SIGBUS)
    only means the input is read back from the node."""
    data = np.random.default_rng(3).bytes(2 * WRITE_STEP)
    writer = SpillWriter(tmp_path / "e.doc")
    writer.allocate(len(data))[:] = data

    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    writer.verified(WRITE_STEP)  # in the hashing thread: must not raise
    assert not writer.finish() and writer.error is not None
    assert writer.error.errno == errno.ENOSPC


def test_an_abandoned_spill_writes_nothing_more(tmp_path: Path) -> None:
    """A refused or cancelled input: its file is closed at once, and a hashing thread still
    at work cannot write to it (or to whatever file reuses its descriptor)."""
    data = np.random.default_rng(4).bytes(2 * WRITE_STEP)
    path = tmp_path / "f.doc"
    writer = SpillWriter(path)
    writer.allocate(len(data))[:] = data
    writer.abandon()
    writer.verified(2 * WRITE_STEP)
    assert path.stat().st_size == 0
    assert not writer.finish() and not writer.kept


@pytest.mark.kubo
def test_a_fetch_from_kubo_writes_its_spill_as_its_leaves_are_hashed(
    kubo: KuboDaemon, tmp_path: Path
) -> None:
    """A document fetched by ``cat`` with a spill writer as its sink: the hashing thread
    hands it each verified prefix, so most of the file is written before the fetch ends,
    and the file holds the document's bytes."""
    gradient = Gradient({"w": np.random.default_rng(5).standard_normal(9 << 20, np.float32)})
    seen: list[int] = []

    class Watched(SpillWriter):
        def verified(self, prefix: int) -> None:
            super().verified(prefix)
            seen.append(self.path.stat().st_size)

    async def go() -> None:
        async with kubo.node() as node:
            store = GradientStore(node)
            cid = await store.put(gradient)
            writer = Watched(tmp_path / "g.doc")
            document = await store.fetch_document(cid, sink=writer)
            assert max(seen) >= len(document) - WRITE_STEP - DIRECT_ALIGN  # during the fetch
            assert await asyncio.to_thread(writer.finish)
            assert writer.path.read_bytes() == document.tobytes()

    asyncio.run(go())
