"""Gradients from and to ``.npz`` files, gradstore's exchange format (never pickled).

Stored (uncompressed) members, what ``np.savez`` writes, are read straight into their
arrays and written straight from them (``_stored_zip``), CRC-32 checked either way;
compressed members (``np.savez_compressed``) are read through ``zipfile`` and NumPy.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable
from io import BufferedReader
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import FormatError
from ..format import EXTENDED, Gradient, dtype_code
from ._names import check_names, stream_name
from ._npy import MAGIC as NPY_MAGIC
from ._npz_directory import NPY, Member, fill, npz_errors, read_directory
from ._stored_zip import StoredZipWriter


def load_npz(path: str | Path, meta: dict[str, Any] | None = None) -> Gradient:
    """Read every array of an ``.npz`` (``allow_pickle=False``) as a gradient."""
    # opened outside npz_errors: a missing or unreadable file is an OSError naming it
    with open(path, "rb") as f, npz_errors(path):
        if not zipfile.is_zipfile(f):
            raise FormatError("not an .npz file (not a zip archive of .npy arrays)")
        with zipfile.ZipFile(f) as zf:
            tensors = _read_members(zf, f)
    if not tensors:
        raise FormatError(f"{path}: the .npz holds no arrays")
    return Gradient(tensors, dict(meta or {}))


def _read_members(zf: zipfile.ZipFile, f: BufferedReader) -> dict[str, np.ndarray[Any, Any]]:
    """Every member as an array, named as ``np.load`` names them (without ``.npy``)."""
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for member in read_directory(zf, f):
        if member.stored:
            flat = member.empty()
            fill(f, member, flat)
            tensors[member.name] = check_array(member.name, member.shaped(flat))
        else:
            tensors[member.name] = check_array(member.name, _read_compressed(zf, member))
    return tensors


def _read_compressed(zf: zipfile.ZipFile, member: Member) -> np.ndarray[Any, Any]:
    with zf.open(member.info) as stream:
        if stream.read(len(NPY_MAGIC)) != NPY_MAGIC:
            raise FormatError(f"member {member.name!r} is not a .npy array")
    with zf.open(member.info) as stream:
        array: np.ndarray[Any, Any] = np.lib.format.read_array(stream, allow_pickle=False)
    return array


def check_array(name: str, value: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``value``, unless it is raw bytes (how NumPy's .npy writes bfloat16 and float8)."""
    if value.dtype.kind == "V" and value.dtype.fields is None:
        raise FormatError(
            f"member {name!r} is raw bytes ({value.dtype.str}), which is "
            "how NumPy's .npy writes bfloat16 and float8 (the type is lost): "
            "use a .safetensors file"
        )
    return value


def check_npz(target: str | Path, gradient: Gradient) -> None:
    """Refuse, before anything is opened, tensors an ``.npz`` cannot hold."""
    check_npz_dtypes(
        target, ((n, dtype_code(np.asarray(a).dtype)) for n, a in gradient.tensors.items())
    )


def check_npz_dtypes(
    target: str | Path, dtypes: Iterable[tuple[str, str | None]], also: str = ""
) -> None:
    """Refuse (tensor name, dtype code) pairs an ``.npz`` cannot hold; ``also`` adds a way out."""
    for name, code in dtypes:
        if code in EXTENDED:
            raise FormatError(
                f"{target}: tensor {name!r} is {code}, which .npz cannot hold "
                "(NumPy's .npy would write raw bytes and lose the type): "
                f"write a .safetensors file instead{also}"
            )


def write_npz(stream: BinaryIO, gradient: Gradient) -> None:
    """Write the tensors as an uncompressed ``.npz`` to ``stream`` (meta is not kept), what
    ``np.savez`` writes and ``np.load`` reads.

    Member by member, each ``.npy`` header followed by the array's own buffer (a copy
    only for an array that is not C-contiguous). ``stream`` need not be seekable (a pipe:
    data descriptors then follow each member). A tensor an ``.npz`` cannot hold (bfloat16,
    float8, objects) or a name the format refuses is refused (FormatError) before the
    first byte is written.
    """
    check_names(stream_name(stream), gradient)
    check_npz(stream_name(stream), gradient)
    for name, value in gradient.tensors.items():
        if np.asarray(value).dtype.hasobject:
            raise FormatError(f"tensor {name!r} holds Python objects, which .npz cannot hold")
    archive = StoredZipWriter(stream)
    for name, value in gradient.tensors.items():
        array = np.asarray(value)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would make 0-d arrays 1-d)
            array = array.copy(order="C")
        header = memoryview(_npy_header(array))
        archive.add(name + NPY, [header, array.reshape(-1).view(np.uint8).data])
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
