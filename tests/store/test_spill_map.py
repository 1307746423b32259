"""SpillMap: a spilled document's buffer is its spill file, mapped; the file's pages are
faulted in by a thread of its own ahead of the fetch's reader, which stops when it closes."""

from __future__ import annotations

import mmap
import time
from pathlib import Path

import pytest

from gradstore.store import SpillMap
from gradstore.store._spilled import MADV_POPULATE_WRITE

MIB = 1 << 20
SMAPS = Path("/proc/self/smaps")


def _resident(path: Path) -> int:
    """Bytes of ``path``'s mapping in this process's memory (its smaps ``Rss``)."""
    lines = SMAPS.read_text().splitlines()
    for at, line in enumerate(lines):
        if line.endswith(str(path)):
            for field in lines[at + 1 :]:
                if field.startswith("Rss:"):
                    return int(field.split()[1]) * 1024
    return 0


def _populate_supported() -> bool:
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        probe.madvise(MADV_POPULATE_WRITE)
    except OSError:
        return False
    finally:
        probe.close()
    return True


pytestmark = pytest.mark.skipif(
    not SMAPS.exists() or not _populate_supported(), reason="needs Linux 5.14 (smaps, populate)"
)


def test_the_spill_files_pages_are_faulted_in_ahead_of_the_reader(tmp_path: Path) -> None:
    spill = SpillMap(tmp_path / "a.doc")
    view = spill.allocate(64 * MIB)
    assert spill.mapped and view.nbytes == 64 * MIB
    deadline = time.monotonic() + 20
    while _resident(spill.path) < 64 * MIB and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _resident(spill.path) == 64 * MIB  # not a byte of it was written by this test
    del view
    assert spill.close()
    assert _resident(spill.path) == 0 and spill.path.stat().st_size == 64 * MIB


def test_closing_stops_the_faulting_in_at_once(tmp_path: Path) -> None:
    spill = SpillMap(tmp_path / "b.doc")
    view = spill.allocate(1024 * MIB)
    del view
    start = time.monotonic()
    assert spill.close()
    assert time.monotonic() - start < 2.0  # one call under way at most (32 MiB), not 1 GiB


def test_a_view_left_over_keeps_the_mapping_but_not_its_pages(tmp_path: Path) -> None:
    """Closed while a view of its buffer is still held (a finished task not yet collected):
    the document's pages leave the process's memory all the same, and the view still reads
    the bytes (from the page cache)."""
    spill = SpillMap(tmp_path / "c.doc")
    view = spill.allocate(16 * MIB)
    view[:] = b"\x07" * (16 * MIB)
    assert _resident(spill.path) == 16 * MIB
    assert spill.close()
    assert _resident(spill.path) == 0
    assert view[12345] == 7 and bytes(view[-3:]) == b"\x07\x07\x07"
