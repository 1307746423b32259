"""A verified document's bytes kept in a local file (a spill file), written and read by ranges.

A coordinator (or an auditor) fetches a document it will spill into ordinary memory, as
``get`` does, and ``SpillWriter`` writes each prefix of it the fetch's hashing thread has
verified to the spill file, with direct I/O, while the rest is still arriving (the bytes
kept are the bytes hashed, written once they were); when the round is aggregated,
``SpilledDocument`` reads them back with ``preadv`` straight into the caller's array (off
the event loop, no copy), instead of fetching and hashing every leaf from the node again.
The file is trusted only by the process that wrote it: a restart deletes it and verifies
the input again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import mmap
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..dag.assemble import anonymous_buffer
from ..errors import DAGError
from ..format import Codec, TensorInfo
from ._stored import ByteRanges, StoredGradient
from ._stored_compressed import StoredCompressed, StoredSparse

#: Direct I/O's alignment of offsets, lengths and buffers (the largest logical block size).
DIRECT_ALIGN: Final = 4096

#: A read of a spill file asks the kernel for this many times its length after it: the
#: files were written around the page cache, and the aggregation pass reads each in order,
#: a window of every input at a time (2 MiB each at 16 inputs), which the disk serves best
#: when the next windows are already on their way.
READ_AHEAD: Final = 4

#: The verified prefix is written once at least this many more bytes of it are in.
WRITE_STEP: Final = 8 << 20


def fits(size: int, free: int, writing: int, reserve: int) -> bool:
    """Whether a document of ``size`` bytes may be spilled: it and ``reserve`` fit in the
    ``free`` bytes of the disk less the ``writing`` bytes other spills are about to take."""
    return size + reserve <= free - writing


def free_space(path: Path) -> int:
    """Free bytes of the file system holding ``path`` (for an unprivileged process)."""
    return shutil.disk_usage(path).free


class SpillWriter:
    """A document's spill file, written from the fetch's buffer as its leaves are verified.

    ``allocate`` gives the fetch an anonymous buffer (``get``'s) and creates the file;
    ``verified(n)``, called by the fetch's hashing thread, writes the first ``n`` bytes once
    ``WRITE_STEP`` more of them are hashed; ``finish`` writes the rest and says whether the
    file holds the document, and ``detach`` hands the buffer back (the caller frees it
    where it likes: unmapping 1 GiB takes 0.2 s). Writes go around the page cache
    (``O_DIRECT``): on these machines a new page-cache page is what a spilled byte cost
    most (2.6 s of CPU a GiB through a shared mapping or ``write``, 0.05 s direct), and the
    spill is read once.
    A file system without direct I/O gets plain writes. A file that cannot be made or
    written (a full disk: an error, never a SIGBUS) leaves the input in memory, read back
    from the node at the close: ``error`` says why."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: OSError | None = None
        self.direct = False  # the file was opened with O_DIRECT
        self._buf: memoryview | None = None
        self._fd: int | None = None
        self._written = 0
        self._whole = False  # finish wrote it all
        self._lock = threading.Lock()  # a write under way against ``abandon`` closing the file

    def allocate(self, size: int) -> memoryview:
        """The buffer of a ``size``-byte document (anonymous memory); creates the file."""
        buf = anonymous_buffer(size)
        if self._buf is not None:
            self.error = self.error or OSError(f"spill file {self.path}: allocated twice")
            return buf
        self._buf = buf
        aligned = _address(buf) % DIRECT_ALIGN == 0
        base = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        direct = getattr(os, "O_DIRECT", 0) if aligned else 0
        try:
            try:
                self._fd = os.open(self.path, base | direct, 0o600)
                self.direct = bool(direct)
            except OSError as exc:
                if not direct or exc.errno != errno.EINVAL:
                    raise
                self._fd = os.open(self.path, base, 0o600)  # no direct I/O here
        except OSError as exc:
            self.error = exc
        return buf

    def verified(self, prefix: int) -> None:
        """The buffer's first ``prefix`` bytes are hashed: written if ``WRITE_STEP`` more are
        (in the caller's thread, the fetch's hasher). A failure only ends the spill."""
        end = prefix - prefix % DIRECT_ALIGN
        if end - self._written >= WRITE_STEP:
            with self._lock:
                self._write(end)

    def finish(self) -> bool:
        """Write what is left and close the file: whether it holds the whole document."""
        with self._lock:
            buf = self._buf
            if buf is not None and self._fd is not None and self.error is None:
                size = len(buf)
                body = size - size % DIRECT_ALIGN if self.direct else size
                self._write(body)
                if self.error is None and body < size:
                    self._write_tail(buf[body:], body)
                self._whole = self.error is None and self._written == size
            self._close()
        return self.kept

    def abandon(self) -> None:
        """Close the file without writing more (a refused, failed or cancelled input)."""
        with self._lock:
            self.error = self.error or OSError(f"spill file {self.path}: abandoned")
            self._close()
            self._buf = None

    def detach(self) -> memoryview | None:
        """The fetch's buffer, no longer this writer's (after ``finish``)."""
        with self._lock:
            buf, self._buf = self._buf, None
        return buf

    @property
    def kept(self) -> bool:
        """Whether the file was written whole (``finish`` returned True)."""
        return self._whole and self.error is None

    def _write(self, end: int) -> None:
        """``buf[written:end]`` to the file (under the lock)."""
        if self._fd is None or self._buf is None or self.error is not None:
            return
        view = self._buf
        try:
            while self._written < end:
                step = min(end - self._written, 64 << 20)
                done = os.pwrite(
                    self._fd, view[self._written : self._written + step], self._written
                )
                if done <= 0:
                    raise OSError(errno.EIO, f"spill file {self.path}: nothing written")
                self._written += done
        except OSError as exc:
            self.error = exc

    def _write_tail(self, tail: memoryview, at: int) -> None:
        """The last bytes, under ``DIRECT_ALIGN``: from an aligned page of their own, then the
        file cut to the document's size."""
        assert self._fd is not None
        page = mmap.mmap(-1, DIRECT_ALIGN)
        try:
            page[: len(tail)] = tail
            os.pwrite(self._fd, memoryview(page), at)
            os.ftruncate(self._fd, at + len(tail))
            self._written = at + len(tail)
        except OSError as exc:
            self.error = exc
        finally:
            page.close()

    def _close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError as exc:
                self.error = self.error or exc
                self._whole = False


def _address(view: memoryview) -> int:
    """Where ``view``'s bytes start in memory."""
    return int(np.frombuffer(view, np.uint8).ctypes.data) if len(view) else 0


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
        with contextlib.suppress(OSError, AttributeError):  # a hint: read once, in order
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)

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
        ahead = offset + done
        if ahead < self.size:  # the next range, read by the kernel while this one is used
            with contextlib.suppress(OSError, AttributeError):
                os.posix_fadvise(self._fd, ahead, READ_AHEAD * done, os.POSIX_FADV_WILLNEED)


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
