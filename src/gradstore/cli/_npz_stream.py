"""An ``.npz`` read by a thread while its document is already being hashed (put, cid).

``put`` and ``cid`` used to read the whole file, then hash (and upload) its document.
Here the arrays are allocated from the ``.npy`` headers, ``encode`` builds the document
over them at once (its data pieces are views of those arrays), and a thread fills them
from the file; the document's iterator hands each stretch of data on only once it is
in, so reading, hashing and uploading overlap.

What is handed on is exactly what ``load_npz`` would have given:

- only arrays that ``encode`` takes as they are (C order, little-endian, NumPy's numeric
  types but ``bool``, whose bytes ``encode`` inspects) are streamed, and the document's
  data pieces must be views of exactly those arrays; anything else is read whole first;
- every member's CRC-32 is checked before its last byte is handed on, and the iterator
  ends only once every member is in and checked: a damaged file fails the command
  before the document's last chunk, so before any root CID exists.
"""

from __future__ import annotations

import functools
import threading
import zipfile
from collections.abc import Iterator
from io import BufferedReader
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .._closing import Closing
from ..dag import CHUNK_SIZE
from ..errors import FormatError
from ..format import EncodedDocument, Gradient, encode
from ._npz import check_array, load_npz, npz_errors
from ._npz_directory import Member, fill, read_directory

STEP = 8 * CHUNK_SIZE
"""Data is handed on in stretches ending on multiples of this in the document (whole
chunks: the chunker then slices them without copying)."""

_STREAMED_KINDS = "fiu"


class _Stopped(Exception):
    """Ends the reading thread early (the command is over)."""


class _Progress:
    """How much of each array is in, shared by the reading thread and the document's reader."""

    def __init__(self, count: int) -> None:
        self._cond = threading.Condition()
        self._filled = [0] * count
        self._done = False
        self._error: BaseException | None = None
        self._stop = False

    def announce(self, index: int, n: int) -> None:
        with self._cond:
            if self._stop:
                raise _Stopped
            self._filled[index] = n
            self._cond.notify_all()

    def finish(self, error: BaseException | None) -> None:
        with self._cond:
            self._done = True
            self._error = error
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stop = True

    @property
    def error(self) -> BaseException | None:
        with self._cond:
            return self._error

    def wait_for(self, index: int, n: int) -> None:
        """Until the first ``n`` bytes of array ``index`` are in; the reader's error if it failed."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or self._filled[index] >= n)
            if self._error is not None:
                raise self._error

    def wait_all(self) -> None:
        """Until every array is in and checked; the reader's error if it failed."""
        with self._cond:
            self._cond.wait_for(lambda: self._done)
            if self._error is not None:
                raise self._error


class _StreamedDocument(EncodedDocument):
    """``doc`` whose data pieces (``plan``: piece -> array index) wait for their bytes."""

    __slots__ = ("_plan", "_progress")

    def __init__(
        self, doc: EncodedDocument, plan: list[tuple[memoryview, int]], progress: _Progress
    ) -> None:
        super().__init__([piece for piece, _ in plan], doc.size)
        self._plan = plan
        self._progress = progress

    def __iter__(self) -> Iterator[memoryview]:
        pos = 0  # document offset of the piece
        for piece, index in self._plan:
            size = piece.nbytes
            if index < 0:  # a header piece
                yield piece
            else:
                at = 0
                while at < size:
                    end = min(size, (pos + at) // STEP * STEP + STEP - pos)
                    self._progress.wait_for(index, end)
                    yield piece[at:end]
                    at = end
            pos += size
        self._progress.wait_all()  # every CRC-32 checked before the iteration ends

    def write_to(self, f: BinaryIO) -> int:
        self._progress.wait_all()
        return super().write_to(f)

    def tobytes(self) -> bytes:
        self._progress.wait_all()
        return super().tobytes()


class NpzStream(Closing):
    """``with NpzStream(path, meta) as npz: use(npz.document())``; see the module docstring.

    ``gradient`` has the file's arrays, filled while the document is read.
    """

    def __init__(self, path: str | Path, meta: dict[str, Any] | None = None) -> None:
        self.path = path
        self._meta = dict(meta or {})
        self._file: BufferedReader | None = None
        self._thread: threading.Thread | None = None
        self._members: list[Member] = []
        self._flats: list[np.ndarray[Any, Any]] = []
        self._progress = _Progress(0)
        self.gradient = self._open()

    def _open(self) -> Gradient:
        f = open(self.path, "rb")  # noqa: SIM115 (closed in close()): OSError names the file
        try:
            with npz_errors(self.path):
                if not zipfile.is_zipfile(f):
                    raise FormatError("not an .npz file (not a zip archive of .npy arrays)")
                with zipfile.ZipFile(f) as zf:
                    members = read_directory(zf, f)
        except BaseException:
            f.close()
            raise
        if not members or not all(_streamable(m) for m in members):
            f.close()
            return load_npz(self.path, self._meta)  # read whole (or refused, as it says)
        self._file = f
        # in the document's order (encode sorts names by their UTF-8 bytes): read as used
        self._members = sorted(members, key=lambda m: m.name.encode("utf-8", "surrogatepass"))
        self._flats = [m.empty() for m in self._members]
        self._progress = _Progress(len(self._members))
        tensors = {m.name: m.shaped(a) for m, a in zip(self._members, self._flats, strict=True)}
        return Gradient(tensors, self._meta)

    def document(self) -> EncodedDocument:
        """The gradient's document; reading starts now (once), the iterator waits for it."""
        doc = encode(self.gradient)
        if self._file is None:
            return doc
        self._start()
        plan = self._plan(doc)
        if plan is None:  # encode did not take the arrays as they are: read, then encode
            self.wait()
            return encode(self.gradient)
        return _StreamedDocument(doc, plan, self._progress)

    def _plan(self, doc: EncodedDocument) -> list[tuple[memoryview, int]] | None:
        """Each piece with the index of the array it is a view of (-1: a header piece);
        None if a data piece is anything else (a copy ``encode`` made)."""
        where = {
            (a.__array_interface__["data"][0], a.nbytes): i
            for i, a in enumerate(self._flats)
            if a.nbytes
        }
        plan: list[tuple[memoryview, int]] = []
        for piece in doc:
            if isinstance(piece.obj, bytes):
                plan.append((piece, -1))
                continue
            key = (
                np.frombuffer(piece, dtype=np.uint8).__array_interface__["data"][0],
                piece.nbytes,
            )
            index = where.pop(key, None)
            if index is None:
                return None
            plan.append((piece, index))
        return plan if not where else None

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._read, name="gradstore-npz", daemon=True)
            self._thread.start()

    def _read(self) -> None:
        assert self._file is not None
        error: BaseException | None = None
        try:
            with npz_errors(self.path):
                for i, (member, flat) in enumerate(zip(self._members, self._flats, strict=True)):
                    fill(self._file, member, flat, functools.partial(self._progress.announce, i))
                    check_array(member.name, flat)
        except _Stopped:
            error = FormatError(f"{self.path}: reading stopped")
        except BaseException as exc:  # handed to whoever reads the document
            error = exc
        self._progress.finish(error)

    def failure(self) -> BaseException | None:
        """The file's refusal, if reading it failed (what a failed command should report)."""
        return self._progress.error

    def wait(self) -> None:
        """Until every array is in and checked (raises the file's refusal)."""
        if self._file is None:
            return
        self._start()
        self._progress.wait_all()

    def close(self) -> None:
        """Stop reading (if it still is) and close the file."""
        self._progress.stop()
        if self._thread is not None:
            self._thread.join()
        if self._file is not None:
            self._file.close()


def _streamable(member: Member) -> bool:
    """Whether ``encode`` takes this member's array as it is (see the module docstring)."""
    dt = member.dtype
    return (
        member.stored
        and dt is not None
        and dt.kind in _STREAMED_KINDS
        and dt.byteorder in "<=|"
        and dt.fields is None
        and dt.subdtype is None
        and not (member.fortran_order and len(member.shape) > 1)
    )
