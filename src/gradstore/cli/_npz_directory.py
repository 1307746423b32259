"""What an ``.npz`` holds, from its zip directory and ``.npy`` headers, before any data is read.

``read_directory`` checks the archive's structure (one member per array name, stored
members within the file and not overlapping each other, no encryption) and parses each
stored member's ``.npy`` header, so shapes and dtypes are known and the arrays can be
allocated at once; ``fill`` then reads a stored member's data into its array,
CRC-32 checked (``_stored_zip``). Compressed members are left to ``zipfile``.
"""

from __future__ import annotations

import itertools
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from io import BufferedReader
from typing import Any

import numpy as np

from ..errors import FormatError
from ._stored_zip import member_data_offset, read_into

PICKLE_REFUSED = "Object arrays cannot be loaded"  # NumPy's message when allow_pickle=False bites
NPY_MAGIC = b"\x93NUMPY"
NPY = ".npy"


@dataclass(frozen=True)
class Member:
    """One member: ``name`` as ``np.load`` names it (without ``.npy``); for a stored member,
    its parsed ``.npy`` header and where the array's bytes are in the file."""

    name: str
    info: zipfile.ZipInfo
    stored: bool
    start: int = -1  # file offset of the .npy header (stored members)
    header_len: int = 0
    shape: tuple[int, ...] = ()
    fortran_order: bool = False
    dtype: np.dtype[Any] | None = None

    @property
    def count(self) -> int:
        """Elements in the array."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    def empty(self) -> np.ndarray[Any, Any]:
        """A flat array for this member's data (nothing touched: no memory is used yet)."""
        assert self.dtype is not None
        return np.empty(self.count, dtype=self.dtype)

    def shaped(self, flat: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``flat`` seen with this member's shape and order (no copy)."""
        if self.fortran_order:
            return flat.reshape(self.shape[::-1]).transpose()
        return flat.reshape(self.shape)


def read_directory(zf: zipfile.ZipFile, f: BufferedReader) -> list[Member]:
    """Every member, in the archive's order, with the checks above (``FormatError``)."""
    size = os.fstat(f.fileno()).st_size
    found: list[tuple[str, zipfile.ZipInfo, int]] = []  # name, info, .npy start (stored)
    names: set[str] = set()
    spans: list[tuple[int, int]] = []
    for info in zf.infolist():
        name = info.filename[: -len(NPY)] if info.filename.endswith(NPY) else info.filename
        if name in names:
            raise FormatError(f"two members hold the array {name!r}")
        names.add(name)
        if info.flag_bits & 0x1:
            raise FormatError(f"member {name!r} is encrypted")
        start = -1
        if info.compress_type == zipfile.ZIP_STORED:
            raw = info.filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
            start = member_data_offset(f, info.header_offset, raw)
            if info.compress_size != info.file_size or start + info.file_size > size:
                raise FormatError(f"member {name!r} claims more bytes than the file holds")
            spans.append((info.header_offset, start + info.file_size))
        found.append((name, info, start))
    spans.sort()
    for (_, end), (next_start, _) in itertools.pairwise(spans):
        if next_start < end:  # members sharing bytes: a small file that reads as a huge one
            raise FormatError("members overlap (a zip bomb?)")
    return [
        _stored(f, info, name, start) if start >= 0 else Member(name, info, stored=False)
        for name, info, start in found
    ]


def _stored(f: BufferedReader, info: zipfile.ZipInfo, name: str, start: int) -> Member:
    """A stored member with its ``.npy`` header parsed (its data is not read)."""
    f.seek(start)
    if info.file_size < len(NPY_MAGIC) or f.read(len(NPY_MAGIC)) != NPY_MAGIC:
        raise FormatError(f"member {name!r} is not a .npy array")
    f.seek(start)
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise FormatError(f"member {name!r} is a .npy of version {version}, not 1.0 or 2.0")
    if dtype.hasobject:
        raise ValueError(f"{PICKLE_REFUSED} when allow_pickle=False")
    if any(d < 0 for d in shape):
        raise FormatError(f"member {name!r} has a negative dimension in {shape}")
    member = Member(name, info, True, start, f.tell() - start, shape, fortran_order, dtype)
    nbytes = member.count * dtype.itemsize
    if member.header_len + nbytes != info.file_size:
        raise FormatError(
            f"member {name!r}: its .npy header declares {nbytes} bytes of data, "
            f"the member holds {info.file_size - member.header_len}"
        )
    return member


def fill(
    f: BufferedReader,
    member: Member,
    flat: np.ndarray[Any, Any],
    progress: Callable[[int], None] | None = None,
) -> None:
    """Read a stored member's data into ``flat`` (``member.empty()``) and check its CRC-32.

    ``progress(n)``: the first ``n`` bytes of ``flat`` are in and may be used; the last
    byte is announced only once the CRC-32 check has passed.
    """
    f.seek(member.start)
    crc = read_into(f, memoryview(bytearray(member.header_len)))
    total = flat.nbytes
    if total:
        announce = None if progress is None else (lambda n: progress(min(n, total - 1)))
        crc = read_into(f, flat.view(np.uint8).data, crc, progress=announce)
    if crc != member.info.CRC:
        raise FormatError(f"member {member.name!r} fails its CRC-32 check (the file is damaged)")
    if progress is not None:
        progress(total)
