"""Uncompressed (stored) zip members read into, and written from, buffers without extra copies.

An ``.npz`` is a zip of ``.npy`` members, almost always stored (``np.savez``). Through
``zipfile`` each member's bytes pass through small ``bytes`` objects, are checked
against their CRC-32, then copied again into the array; writing goes through
``tobytes`` copies the same way. Here a member's data goes straight between the file
and the array's own buffer (one kernel copy), and its CRC-32 is computed in a second
thread while the data moves (``zlib.crc32`` releases the GIL): the same check, about
half the time.

Writing: sizes are known before the data, so a seekable file gets plain local headers
whose CRC is filled in once the data is written; a stream that cannot seek (a pipe)
gets a data descriptor after each member instead, as ``zipfile`` does. Zip64 records
appear only where a size or offset needs them. Every member is dated 1980-01-01, so
the same arrays always give the same bytes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from io import BufferedReader
from typing import BinaryIO

from ..errors import FormatError

CHUNK = 8 << 20
"""Bytes read per ``readinto`` while the previous chunk's CRC-32 is computed."""

ZIP64_LIMIT = (1 << 31) - 1
"""Sizes and offsets above this get zip64 records (``zipfile``'s limit: signed readers)."""

_LOCAL = struct.Struct("<4s2B4HL2L2H")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_END = struct.Struct("<4s4H2LH")
_END64 = struct.Struct("<4sQ2H2L4Q")
_END64_LOCATOR = struct.Struct("<4sLQL")
_LOCAL_SIG = b"PK\x03\x04"
_CENTRAL_SIG = b"PK\x01\x02"
_END_SIG = b"PK\x05\x06"
_END64_SIG = b"PK\x06\x06"
_END64_LOCATOR_SIG = b"PK\x06\x07"
_DESCRIPTOR_SIG = b"PK\x07\x08"
_CRC_AT = 14  # offset of the CRC-32 in a local header
_FLAG_DESCRIPTOR = 0x08
_FLAG_UTF8 = 0x800
_VERSION = 20
_VERSION_ZIP64 = 45
_UNIX = 3
_DOS_DATE_1980 = (0 << 9) | (1 << 5) | 1  # 1980-01-01, time 00:00:00 is 0
_MODE = 0o600 << 16  # rw-------, as zipfile gives members written with ZipFile.open
_MAX_FIELD = 0xFFFFFFFF
_MAX_COUNT = 0xFFFF


# --- reading ---------------------------------------------------------------------------------


def member_data_offset(f: BufferedReader, header_offset: int, name: bytes) -> int:
    """Where a member's data starts: after its local header, which must name ``name``."""
    f.seek(header_offset)
    fixed = f.read(_LOCAL.size)
    if len(fixed) != _LOCAL.size or fixed[:4] != _LOCAL_SIG:
        raise FormatError("bad local file header (not a zip member where the directory says)")
    fields = _LOCAL.unpack(fixed)
    name_len, extra_len = int(fields[-2]), int(fields[-1])
    if f.read(name_len) != name:
        raise FormatError("the local file header names another member than the directory")
    return header_offset + _LOCAL.size + name_len + extra_len


def read_into(f: BufferedReader, out: memoryview, crc: int = 0) -> int:
    """Fill ``out`` from ``f``'s position; return the running CRC-32 of ``crc`` and the bytes.

    A chunk's CRC is computed in a second thread while the next chunk is read. Raises
    ``FormatError`` if the file ends first.
    """
    if len(out) <= CHUNK:
        _fill(f, out)
        return zlib.crc32(out, crc)
    pending: Future[int] | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="gradstore-crc") as pool:
        for start in range(0, len(out), CHUNK):
            chunk = out[start : start + CHUNK]
            _fill(f, chunk)
            if pending is not None:
                crc = pending.result()
            pending = pool.submit(zlib.crc32, chunk, crc)
        assert pending is not None
        return pending.result()


def _fill(f: BufferedReader, out: memoryview) -> None:
    pos = 0
    while pos < len(out):
        n = f.readinto(out[pos:])
        if not n:
            raise FormatError(f"truncated: the file ends {len(out) - pos} bytes early")
        pos += n


# --- writing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    name: bytes
    flags: int
    crc: int
    size: int
    offset: int


class StoredZipWriter:
    """Write a zip archive of stored members to ``stream``; ``close()`` writes the directory.

    A stream that cannot seek back (``stream.seekable()`` is False: a pipe, a device)
    gets a data descriptor after each member instead of a CRC filled in afterwards.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._seekable = stream.seekable()
        self._base = stream.tell() if self._seekable else 0
        self._pos = 0  # bytes written, counted here (a pipe cannot tell)
        self._entries: list[_Entry] = []

    def add(self, name: str, pieces: Sequence[memoryview]) -> None:
        """One member named ``name`` holding the concatenation of ``pieces`` (format 'B')."""
        raw, flags = _encode_name(name)
        size = sum(p.nbytes for p in pieces)
        offset = self._pos
        zip64 = size > ZIP64_LIMIT
        known = size  # sizes in the local header: zero before a data descriptor (as zipfile)
        if not self._seekable:
            flags |= _FLAG_DESCRIPTOR
            known = 0
        extra = struct.pack("<2H2Q", 1, 16, known, known) if zip64 else b""
        field = _MAX_FIELD if zip64 else known
        version = _VERSION_ZIP64 if zip64 else _VERSION
        header = _LOCAL.pack(
            _LOCAL_SIG,
            version,
            0,
            flags,
            0,
            0,
            _DOS_DATE_1980,
            0,
            field,
            field,
            len(raw),
            len(extra),
        )
        self._write(header + raw + extra)
        crc = self._write_checked(pieces)
        if self._seekable:  # the CRC-32 into the local header, then back to the end
            self._stream.seek(self._base + offset + _CRC_AT)
            self._stream.write(struct.pack("<L", crc))
            self._stream.seek(self._base + self._pos)
        elif zip64:
            self._write(struct.pack("<4sL2Q", _DESCRIPTOR_SIG, crc, size, size))
        else:
            self._write(struct.pack("<4s3L", _DESCRIPTOR_SIG, crc, size, size))
        self._entries.append(_Entry(raw, flags, crc, size, offset))

    def close(self) -> None:
        """Write the central directory and the end records."""
        start = self._pos
        for e in self._entries:
            wide: list[int] = []
            if e.size > ZIP64_LIMIT:
                wide += [e.size, e.size]
            if e.offset > ZIP64_LIMIT:
                wide.append(e.offset)
            extra = struct.pack(f"<2H{len(wide)}Q", 1, 8 * len(wide), *wide) if wide else b""
            field = _MAX_FIELD if e.size > ZIP64_LIMIT else e.size
            version = _VERSION_ZIP64 if wide else _VERSION
            offset = _MAX_FIELD if e.offset > ZIP64_LIMIT else e.offset
            central = _CENTRAL.pack(
                _CENTRAL_SIG, version, _UNIX, version, 0, e.flags, 0, 0, _DOS_DATE_1980,
                e.crc, field, field, len(e.name), len(extra), 0, 0, 0, _MODE, offset,
            )  # fmt: skip
            self._write(central + e.name + extra)
        size = self._pos - start
        count = len(self._entries)
        if count >= _MAX_COUNT or size > ZIP64_LIMIT or start > ZIP64_LIMIT:
            end64 = self._pos
            self._write(
                _END64.pack(
                    _END64_SIG, 44, _VERSION_ZIP64, _VERSION_ZIP64, 0, 0, count, count, size, start
                )
            )
            self._write(_END64_LOCATOR.pack(_END64_LOCATOR_SIG, 0, end64, 1))
            count = min(count, _MAX_COUNT)
            size = min(size, _MAX_FIELD)
            start = min(start, _MAX_FIELD)
        self._write(_END.pack(_END_SIG, 0, 0, count, count, size, start, 0))

    def _write_checked(self, pieces: Sequence[memoryview]) -> int:
        """Write ``pieces`` while a second thread computes their CRC-32; return it."""
        if sum(p.nbytes for p in pieces) <= CHUNK:
            for piece in pieces:
                self._write(piece)
            return _crc_of(pieces)
        with ThreadPoolExecutor(1, thread_name_prefix="gradstore-crc") as pool:
            crc = pool.submit(_crc_of, pieces)
            for piece in pieces:
                self._write(piece)
            return crc.result()

    def _write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view.nbytes:
            n = self._stream.write(view)
            if n is None:  # a non-blocking raw stream that could not write
                raise BlockingIOError("a blocking stream is needed")
            self._pos += n
            view = view[n:]


def _crc_of(pieces: Sequence[memoryview]) -> int:
    crc = 0
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
    return crc


def _encode_name(name: str) -> tuple[bytes, int]:
    """The member name's bytes and flags: ASCII as is, else UTF-8 with the flag that says so."""
    try:
        return name.encode("ascii"), 0
    except UnicodeEncodeError:
        return name.encode("utf-8"), _FLAG_UTF8
