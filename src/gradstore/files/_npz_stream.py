"""An ``.npz`` of plain arrays read into its document while the document is read (put, cid).

A plain array (``_npy``) is stored in a document byte for byte, so the document of a file
of plain arrays is the file's own bytes under other headers: its header pieces come from
the ``.npy`` headers, and iterating it reads each member's data from the file, in
stretches of ``STEP`` bytes that end on the document's chunk boundaries (the chunker then
slices them without copying). Nothing is held but the stretches in flight, so ``put`` of
a file of any size uses a few MiB and never touches fresh memory for all of it at once
(on these machines that costs more than reading the file), and NumPy is not loaded.

Every member's CRC-32 is checked before the last stretch of its data is handed on (an
empty member's before the document is), so a damaged file fails the command before the
document's last chunk: before any root CID exists. Iterating again reads the file again
(``put`` resends a DAG that Kubo's garbage collector cut into).

Any other file (a compressed member, bool, big-endian or Fortran-order arrays, ...) is
not streamed (``NpzStream.open`` gives None): ``_tensor_files`` reads it whole through NumPy.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
import zlib
from collections.abc import Iterator
from io import BufferedReader
from pathlib import Path
from typing import Any

from .._closing import Closing
from ..dag import CHUNK_SIZE
from ..errors import FormatError
from ..format import EncodedDocument, Limits, check_layout, dense_layout
from ._npz_directory import Member, check_crc, npz_errors, read_directory

STEP = 4 * CHUNK_SIZE
"""Data is read in stretches ending on multiples of this in the document (whole chunks)."""


class NpzStream(Closing):
    """``with NpzStream.open(path, meta) as npz: use(npz.document())``; see the module
    docstring."""

    def __init__(
        self, path: str | Path, meta: dict[str, Any], file: BufferedReader, members: list[Member]
    ) -> None:
        self.path = path
        self._meta = meta
        self._file = file
        self._members = {m.name: m for m in members}
        self._failure: BaseException | None = None

    @classmethod
    def open(cls, path: str | Path, meta: dict[str, Any] | None = None) -> NpzStream | None:
        """The file as a stream, if every member is a plain array; None if it holds anything
        else. Reads the zip directory and the ``.npy`` headers only (``FormatError`` names
        the file for anything refused)."""
        f = open(path, "rb")  # noqa: SIM115 (closed in close()): OSError names the file
        try:
            with npz_errors(path):
                if not zipfile.is_zipfile(f):
                    raise FormatError("not an .npz file (not a zip archive of .npy arrays)")
                with zipfile.ZipFile(f) as zf:
                    members = read_directory(zf, f)
        except BaseException:
            f.close()
            raise
        if members and all(m.plain is not None for m in members):
            return cls(path, dict(meta or {}), f, members)
        f.close()
        return None

    def document(self) -> EncodedDocument:
        """The gradient's document (the format's refusals of names and meta raise here,
        naming the file)."""
        with npz_errors(self.path):
            layout, size = dense_layout(
                self._meta,
                {n: (m.plain or "", m.shape, m.nbytes) for n, m in self._members.items()},
            )
        for member in self._members.values():
            if not member.nbytes:  # no stretch of data will check it
                with self._refusals():
                    check_crc(member, self._crc_of_header(member))
        return _FileDocument(self, layout, size)

    def check(self, size: int, limits: Limits) -> None:
        """Refuse (``LimitExceededError``) a document of ``size`` bytes over ``limits``."""
        shapes = [(name, m.shape) for name, m in self._members.items()]
        check_layout(size, self._meta, shapes, limits)

    def failure(self) -> BaseException | None:
        """The file's refusal, if reading it failed (what a failed command should report)."""
        return self._failure

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def data(self, name: str, pos: int) -> Iterator[memoryview]:
        """Member ``name``'s data, whose first byte is at document offset ``pos``, in
        stretches; its CRC-32 checked before the last is handed on."""
        member = self._members[name]
        with self._refusals():
            crc = self._crc_of_header(member)
        total = member.nbytes
        base = member.start + member.header_len
        at = 0
        while at < total:
            end = min(total, (pos + at) // STEP * STEP + STEP - pos)
            with self._refusals():
                stretch = self._pread(base + at, end - at)
                crc = zlib.crc32(stretch, crc)
                if end == total:
                    check_crc(member, crc)
            at = end
            yield memoryview(stretch)

    @contextlib.contextmanager
    def _refusals(self) -> Iterator[None]:
        """Refusals name the file, and are kept for ``failure``."""
        try:
            with npz_errors(self.path):
                yield
        except Exception as exc:
            self._failure = exc
            raise

    def _crc_of_header(self, member: Member) -> int:
        return zlib.crc32(self._pread(member.start, member.header_len))

    def _pread(self, offset: int, n: int) -> bytes:
        data = os.pread(self._file.fileno(), n, offset)
        while len(data) < n:  # a short read: rare on a file, but allowed
            more = os.pread(self._file.fileno(), n - len(data), offset + len(data))
            if not more:
                raise FormatError(f"truncated: the file ends {n - len(data)} bytes early")
            data += more
        return data


class _FileDocument(EncodedDocument):
    """The document of an ``NpzStream``'s plain members: its header pieces, and each
    member's data read from the file as the iteration reaches it."""

    __slots__ = ("_layout", "_stream")

    def __init__(self, stream: NpzStream, layout: list[bytes | str], size: int) -> None:
        super().__init__([], size)
        self._stream = stream
        self._layout = layout

    def __iter__(self) -> Iterator[memoryview]:
        pos = 0
        for piece in self._layout:
            if isinstance(piece, bytes):
                yield memoryview(piece)
                pos += len(piece)
            else:
                for stretch in self._stream.data(piece, pos):
                    yield stretch
                    pos += stretch.nbytes
