"""A verified document's bytes kept in a local file (a spill file), written and read by ranges.

A coordinator (or an auditor) fetches a document it will spill straight into its spill
file, mapped (``SpillMap``: the fetch's buffer is the file's pages, so the bytes hashed are
the bytes kept, and no second copy is made), if it fits on the disk (``fits``); when
the round is aggregated, ``SpilledDocument`` reads them back with ``preadv`` straight into
the caller's array (off the event loop, no copy), instead of fetching and hashing every
leaf from the node again. The file is trusted only by the process that wrote it: a
restart deletes it and verifies the input again.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import mmap
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..dag.assemble import anonymous_buffer
from ..errors import DAGError
from ..format import Codec, TensorInfo
from ._stored import ByteRanges, StoredGradient
from ._stored_compressed import StoredCompressed, StoredSparse

#: ``madvise`` advice that faults a range's pages in, writable (Linux 5.14; older: EINVAL).
MADV_POPULATE_WRITE: Final = 23

#: Bytes of a spill file's mapping faulted in per ``madvise`` call, ahead of the reader.
PREFAULT_BYTES: Final = 32 << 20


def fits(size: int, free: int, writing: int, reserve: int) -> bool:
    """Whether a document of ``size`` bytes may be spilled: it and ``reserve`` fit in the
    ``free`` bytes of the disk less the ``writing`` bytes other spills are about to take."""
    return size + reserve <= free - writing


def free_space(path: Path) -> int:
    """Free bytes of the file system holding ``path`` (for an unprivileged process)."""
    return shutil.disk_usage(path).free


class SpillMap:
    """A document's spill file as the fetch's buffer (``allocate``): created at its size,
    its blocks reserved (``posix_fallocate``: writing the mapping can then never find the
    disk full, which would kill the process with SIGBUS) and mapped shared, so the fetch's
    reads land in the file's pages and its leaves are hashed there. A file that cannot be
    made (a full disk, a file system without room) gives an anonymous buffer instead and
    ``error``: the input is then read back from the node, it does not fail.

    The file's new pages are faulted in by a thread of its own ahead of the fetch's reader
    (``_Prefault``): a new page-cache page is what a spilled byte costs most on a machine
    that backs its memory lazily (docs/design/spill.md, "Cost"), and the reader, which
    would otherwise fault each one in the middle of its copy, is the fetch's slowest thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: OSError | None = None
        self._map: mmap.mmap | None = None
        self._prefault: _Prefault | None = None

    def allocate(self, size: int) -> memoryview:
        """The buffer of a ``size``-byte document: the file's mapping (else anonymous memory)."""
        if self._map is not None or size == 0:
            self.error = self.error or OSError(f"spill file {self.path}: nothing to map")
            return anonymous_buffer(size)
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(self.path, flags, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
                self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
        except OSError as exc:
            self.error = exc
            return anonymous_buffer(size)
        self._prefault = _Prefault(self._map, size)
        return memoryview(self._map)

    @property
    def mapped(self) -> bool:
        """Whether the fetch's buffer is the file (else nothing was spilled)."""
        return self._map is not None and self.error is None

    def close(self) -> bool:
        """Unmap the file (its pages stay in the page cache, written back by the kernel, no
        fsync: a crash's spill files are never read); whether it holds the document. A view
        of the buffer still held somewhere (a finished task not yet collected, a failure's
        traceback) keeps the mapping until it goes, but not its pages: they leave the
        process's memory at once (``MADV_DONTNEED``: a shared file mapping's pages stay in
        the page cache, dirty ones too, and a late read faults them back in), so the next
        input's document is never held beside this one's."""
        if self._prefault is not None:
            self._prefault.stop()
            self._prefault = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                self._map.madvise(mmap.MADV_DONTNEED)
        return self.mapped


class _Prefault:
    """Faults a mapping's pages in, from its start, ``PREFAULT_BYTES`` at a time, in a thread
    of its own (``madvise`` through ctypes: the GIL is released while the kernel works); it
    stops at ``stop``, at the end, or at the first refusal (a kernel without the advice)."""

    def __init__(self, mapping: mmap.mmap, size: int) -> None:
        held = ctypes.c_char.from_buffer(mapping)  # only to learn the address: let go at once
        self._base = ctypes.addressof(held)
        del held
        self._size = size
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gradstore-prefault", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        madvise = _madvise()
        for offset in range(0, self._size, PREFAULT_BYTES):
            if self._stop.is_set():
                return
            length = min(PREFAULT_BYTES, self._size - offset)
            if madvise(self._base + offset, length, MADV_POPULATE_WRITE) != 0:
                return  # the reader faults the rest in itself

    def stop(self) -> None:
        """Stop, and wait for the call under way (before the mapping goes)."""
        self._stop.set()
        self._thread.join()


@functools.cache
def _madvise() -> Callable[[int, int, int], int]:
    """libc's ``madvise(addr, length, advice)``."""
    libc = ctypes.CDLL(None, use_errno=True)
    call = libc.madvise
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    return call


class SpilledDocument:
    """The ``size`` bytes of a verified document in the file at ``path`` (opened at once)."""

    def __init__(self, path: str | Path, size: int) -> None:
        self.path = Path(path)
        self.size = size
        self._fd: int | None = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        held = os.fstat(self._fd).st_size
        if held != size:
            self.close()
            raise DAGError(f"spill file {self.path} holds {held} bytes, the document {size}")

    def close(self) -> None:
        """Close the file (reads after this fail)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def read_into(self, offset: int, out: np.ndarray[Any, Any]) -> None:
        """Fill ``out`` (uint8) with the document's bytes ``offset .. offset + len(out)``."""
        length = int(out.size)
        if offset < 0 or offset + length > self.size:
            raise ValueError(f"range {offset}+{length} is outside the {self.size}-byte document")
        if length:
            await asyncio.to_thread(self._pread, offset, out)

    def _pread(self, offset: int, out: np.ndarray[Any, Any]) -> None:
        if self._fd is None:
            raise ValueError(f"spill file {self.path} is closed")
        view = out.data.cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got == 0:
                raise DAGError(f"spill file {self.path} ended at {offset + done} of {self.size}")
            done += got


def spilled_source(
    document: ByteRanges, tensors: Mapping[str, TensorInfo], codec: Codec | None
) -> StoredGradient | StoredCompressed:
    """An ``aggregate.InputSource`` over a spilled document (or any verified ``ByteRanges``:
    a node's, read ahead): ``StoredGradient``, or ``StoredCompressed``/``StoredSparse``
    decompressing."""
    if codec is None:
        return StoredGradient(document, tensors)
    kind = StoredSparse if codec.sparse else StoredCompressed
    return kind(document, tensors, codec)
