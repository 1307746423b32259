"""Gradients from and to ``.npz`` files, the CLI's exchange format (never pickled).

Stored (uncompressed) members, what ``np.savez`` writes, are read straight into their
arrays and written straight from them (``_stored_zip``), CRC-32 checked either way;
compressed members (``np.savez_compressed``) are read through ``zipfile`` and NumPy.
"""

from __future__ import annotations

import itertools
import os
import zipfile
from io import BufferedReader
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import FormatError
from ..format import EXTENDED, Gradient, dtype_code
from ._stored_zip import StoredZipWriter, member_data_offset, read_into

_PICKLE_REFUSED = "Object arrays cannot be loaded"  # NumPy's message when allow_pickle=False bites
_NPY_MAGIC = b"\x93NUMPY"
_NPY = ".npy"


def load_npz(path: str | Path, meta: dict[str, Any] | None = None) -> Gradient:
    """Read every array of an ``.npz`` (``allow_pickle=False``) as a gradient."""
    with open(path, "rb") as f:  # a missing or unreadable file is an OSError naming it
        if not zipfile.is_zipfile(f):
            raise FormatError(f"{path}: not an .npz file (not a zip archive of .npy arrays)")
        try:
            with zipfile.ZipFile(f) as zf:
                tensors = _read_members(zf, f)
        except FormatError as exc:
            raise FormatError(f"{path}: {exc}") from exc
        except ValueError as exc:
            if _PICKLE_REFUSED in str(exc):
                raise FormatError(
                    f"{path}: holds an object array (pickled Python objects); "
                    "gradstore loads plain numeric arrays only (allow_pickle=False)"
                ) from exc
            raise FormatError(f"{path}: not a readable .npz of plain arrays ({exc})") from exc
        except (OSError, zipfile.BadZipFile, EOFError, RuntimeError) as exc:
            raise FormatError(f"{path}: not a readable .npz of plain arrays ({exc})") from exc
    if not tensors:
        raise FormatError(f"{path}: the .npz holds no arrays")
    return Gradient(tensors, dict(meta or {}))


def _read_members(zf: zipfile.ZipFile, f: BufferedReader) -> dict[str, np.ndarray[Any, Any]]:
    """Every member as an array, named as ``np.load`` names them (without ``.npy``)."""
    size = os.fstat(f.fileno()).st_size
    members: list[tuple[str, zipfile.ZipInfo, int]] = []  # name, info, data start (stored)
    names: set[str] = set()
    spans: list[tuple[int, int]] = []
    for info in zf.infolist():
        name = info.filename[: -len(_NPY)] if info.filename.endswith(_NPY) else info.filename
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
        members.append((name, info, start))
    spans.sort()
    for (_, end), (next_start, _) in itertools.pairwise(spans):
        if next_start < end:  # members sharing bytes: a small file that reads as a huge one
            raise FormatError("members overlap (a zip bomb?)")
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for name, info, start in members:
        if start >= 0:
            value = _read_stored(f, info, name, start)
        else:
            with zf.open(info) as member:
                if member.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                    raise FormatError(f"member {name!r} is not a .npy array")
            with zf.open(info) as member:
                value = np.lib.format.read_array(member, allow_pickle=False)
        if value.dtype.kind == "V" and value.dtype.fields is None:
            raise FormatError(
                f"member {name!r} is raw bytes ({value.dtype.str}), which is "
                "how NumPy's .npy writes bfloat16 and float8 (the type is lost): "
                "use a .safetensors file"
            )
        tensors[name] = value
    return tensors


def _read_stored(
    f: BufferedReader, info: zipfile.ZipInfo, name: str, start: int
) -> np.ndarray[Any, Any]:
    """One stored ``.npy`` member whose data begins at ``start``: read straight into the
    array, CRC-32 checked."""
    f.seek(start)
    if info.file_size < len(_NPY_MAGIC) or f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
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
        raise ValueError(f"{_PICKLE_REFUSED} when allow_pickle=False")
    if any(d < 0 for d in shape):
        raise FormatError(f"member {name!r} has a negative dimension in {shape}")
    header = f.tell() - start
    count = 1
    for d in shape:
        count *= d
    nbytes = count * dtype.itemsize
    if header + nbytes != info.file_size:
        raise FormatError(
            f"member {name!r}: its .npy header declares {nbytes} bytes of data, "
            f"the member holds {info.file_size - header}"
        )
    f.seek(start)
    crc = read_into(f, memoryview(bytearray(header)))
    flat = np.empty(count, dtype=dtype)
    if nbytes:
        crc = read_into(f, flat.view(np.uint8).data, crc)
    if crc != info.CRC:
        raise FormatError(f"member {name!r} fails its CRC-32 check (the file is damaged)")
    if fortran_order:
        return flat.reshape(shape[::-1]).transpose()
    return flat.reshape(shape)


def check_npz(target: str | Path, gradient: Gradient) -> None:
    """Refuse, before anything is opened, tensors an ``.npz`` cannot hold."""
    for name, array in gradient.tensors.items():
        code = dtype_code(np.asarray(array).dtype)
        if code in EXTENDED:
            raise FormatError(
                f"{target}: tensor {name!r} is {code}, which .npz cannot hold "
                "(NumPy's .npy would write raw bytes and lose the type): "
                "write a .safetensors file instead"
            )


def write_npz(stream: BinaryIO, gradient: Gradient) -> None:
    """Write the tensors as an uncompressed ``.npz`` to ``stream`` (meta is not kept).

    Member by member, so any tensor name works (``file`` included), each ``.npy``
    header followed by the array's own buffer (a copy only for an array that is not
    C-contiguous). ``stream`` need not be seekable (a pipe: data descriptors then
    follow each member).
    """
    archive = StoredZipWriter(stream)
    for name, value in gradient.tensors.items():
        array = np.asarray(value)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would make 0-d arrays 1-d)
            array = array.copy(order="C")
        if array.dtype.hasobject:
            raise FormatError(f"tensor {name!r} holds Python objects, which .npz cannot hold")
        header = memoryview(_npy_header(array))
        archive.add(name + _NPY, [header, array.reshape(-1).view(np.uint8).data])
    archive.close()


def _npy_header(array: np.ndarray[Any, Any]) -> bytes:
    """The ``.npy`` header ``np.save`` writes for a C-contiguous ``array`` (1.0, else 2.0)."""
    fields = np.lib.format.header_data_from_array_1_0(array)
    for write in (np.lib.format.write_array_header_1_0, np.lib.format.write_array_header_2_0):
        out = _Collect()
        try:
            write(out, fields)
        except ValueError:  # the header is too long for this version
            continue
        return b"".join(out.parts)
    raise FormatError(f"the .npy header of shape {array.shape} is too long")


class _Collect:
    """The file object NumPy's header writers are given: it keeps what they write."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)
