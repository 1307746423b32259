"""What an ``.npz`` holds, from its zip directory and ``.npy`` headers, before any data is read.

``read_directory`` checks the archive's structure (one member per array name, stored
members within the file and not overlapping each other, no encryption) and parses each
stored member's ``.npy`` header, so shapes and dtypes are known and the arrays can be
allocated at once; ``fill`` then reads a stored member's data into its array,
CRC-32 checked (``_stored_zip``). Compressed members are left to ``zipfile``.

A plain array's header (``_npy``) is parsed without NumPy, so a file of plain arrays is
described, and can be streamed into its document, before NumPy is loaded (if ever).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FormatError
from ._npy import MAGIC as NPY_MAGIC
from ._npy import MAX_HEADER, parse_plain
from ._stored_zip import member_data_offset, read_into

if TYPE_CHECKING:
    import numpy as np

PICKLE_REFUSED = "Object arrays cannot be loaded"  # NumPy's message when allow_pickle=False bites
NPY = ".npy"


@contextlib.contextmanager
def npz_errors(path: str | Path) -> Iterator[None]:
    """Every refusal of an ``.npz`` as one ``FormatError`` that names the file."""
    try:
        yield
    except FormatError as exc:
        raise FormatError(f"{path}: {exc}") from exc
    except ValueError as exc:
        if PICKLE_REFUSED in str(exc):
            raise FormatError(
                f"{path}: holds an object array (pickled Python objects); "
                "gradstore loads plain numeric arrays only (allow_pickle=False)"
            ) from exc
        raise FormatError(f"{path}: not a readable .npz of plain arrays ({exc})") from exc
    except (OSError, zipfile.BadZipFile, EOFError, RuntimeError) as exc:
        raise FormatError(f"{path}: not a readable .npz of plain arrays ({exc})") from exc


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
    parsed_dtype: np.dtype[Any] | None = None  # as NumPy's reader parsed it (not plain)
    plain: str | None = None  # a plain array's dtype string (parsed without NumPy)

    @property
    def dtype(self) -> np.dtype[Any] | None:
        """The array's NumPy dtype (None for a compressed member)."""
        if self.plain is not None:
            import numpy as np

            return np.dtype(self.plain)
        return self.parsed_dtype

    @property
    def nbytes(self) -> int:
        """Bytes of array data after the ``.npy`` header (stored members)."""
        return self.info.file_size - self.header_len

    @property
    def count(self) -> int:
        """Elements in the array."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    def empty(self) -> np.ndarray[Any, Any]:
        """A flat array for this member's data (nothing touched: no memory is used yet)."""
        import numpy as np

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
    """A stored member with its ``.npy`` header parsed (its data is not read): by ``_npy``
    if it is a plain array's, else by NumPy's reader."""
    f.seek(start)
    head = f.read(min(info.file_size, MAX_HEADER + 16))
    if len(head) < len(NPY_MAGIC) or head[: len(NPY_MAGIC)] != NPY_MAGIC:
        raise FormatError(f"member {name!r} is not a .npy array")
    plain = parse_plain(head)
    if plain is not None:
        member = Member(name, info, True, start, plain.length, plain.shape, plain=plain.dtype)
        nbytes = plain.nbytes
    else:
        member = _parsed_by_numpy(f, info, name, start)
        assert member.parsed_dtype is not None
        nbytes = member.count * member.parsed_dtype.itemsize
    if any(d < 0 for d in member.shape):
        raise FormatError(f"member {name!r} has a negative dimension in {member.shape}")
    if member.header_len + nbytes != info.file_size:
        raise FormatError(
            f"member {name!r}: its .npy header declares {nbytes} bytes of data, "
            f"the member holds {info.file_size - member.header_len}"
        )
    return member


def _parsed_by_numpy(f: BufferedReader, info: zipfile.ZipInfo, name: str, start: int) -> Member:
    import numpy as np

    f.seek(start)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise FormatError(f"member {name!r} is a .npy of version {version}, not 1.0 or 2.0")
    except (FormatError, ValueError):
        raise
    except Exception as exc:  # NumPy's reader on hostile bytes (its Python 2 fallback: tokenize)
        raise FormatError(f"member {name!r} has an unreadable .npy header ({exc})") from exc
    if dtype.hasobject:
        raise ValueError(f"{PICKLE_REFUSED} when allow_pickle=False")
    if not all(type(d) is int for d in shape):  # NumPy's check lets bools through
        raise FormatError(f"member {name!r} has a shape of other things than integers: {shape}")
    return Member(name, info, True, start, f.tell() - start, shape, fortran_order, dtype)


def fill(f: BufferedReader, member: Member, flat: np.ndarray[Any, Any]) -> None:
    """Read a stored member's data into ``flat`` (``member.empty()``) and check its CRC-32."""
    import numpy as np  # (loaded: flat is an array)

    f.seek(member.start)
    crc = read_into(f, memoryview(bytearray(member.header_len)))
    if flat.nbytes:
        crc = read_into(f, flat.view(np.uint8).data, crc)
    check_crc(member, crc)


def check_crc(member: Member, crc: int) -> None:
    """Refuse a member whose bytes do not have the CRC-32 its zip entry records."""
    if crc != member.info.CRC:
        raise FormatError(f"member {member.name!r} fails its CRC-32 check (the file is damaged)")
