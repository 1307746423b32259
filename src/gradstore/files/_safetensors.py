"""Gradients from and to ``.safetensors`` files, through the ``safetensors`` package (never pickled).

safetensors names dtypes its own way (``F32``, ``BF16``, ``F8_E4M3``); the table below
maps them to the document's. Its NumPy loader does not build float8 arrays (0.8 fails on
them), so files holding bfloat16 or float8 are read through its parser (``deserialize``)
and given the document's dtypes here; every other file through ``safe_open``.

safetensors writes files, not streams: a stream gets a file built in a temporary
directory, then copied.

The package is an optional extra: this module imports it when a file is read or
written, and says which extra to install when it is missing (``MissingExtraError``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Final

import numpy as np

from ..errors import FormatError, MissingExtraError
from ..format import EXTENDED, Gradient, dtype_code, numpy_dtype
from ._names import check_names, stream_name

#: safetensors dtype -> document dtype (F8_E4M3 is PyTorch's float8_e4m3fn).
CODES: Final[dict[str, str]] = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "U64": "<u8", "I32": "<i4", "U32": "<u4", "I16": "<i2", "U16": "<u2",
    "I8": "|i1", "U8": "|u1", "BOOL": "|b1",
    "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}  # fmt: skip
_KINDS: Final = {code: kind for kind, code in CODES.items()}

EXTRA: Final = "safetensors"


def _package() -> Any:
    try:
        import safetensors
        import safetensors.numpy
    except ImportError:
        raise MissingExtraError(EXTRA, ".safetensors files") from None
    return safetensors


def load_safetensors(path: str | Path, meta: dict[str, Any] | None = None) -> Gradient:
    """Every tensor of a ``.safetensors`` file as a gradient (the file's own metadata is not kept).

    Raises FormatError for a file safetensors cannot parse or a dtype gradstore/1 cannot
    hold, MissingExtraError without the ``safetensors`` (or, for bfloat16/float8,
    ``ml-dtypes``) extra.
    """
    st = _package()
    with open(path, "rb"):  # a missing or unreadable file is an OSError naming it
        pass
    try:
        with st.safe_open(str(path), framework="np") as f:
            names: list[str] = f.keys()  # a safe_open handle is not iterable
            kinds = {name: f.get_slice(name).get_dtype() for name in names}
            codes = {name: _code(path, name, kind) for name, kind in kinds.items()}
            narrow = any(code in EXTENDED for code in codes.values())
            tensors = {} if narrow else {name: f.get_tensor(name) for name in kinds}
        if narrow:
            for code in codes.values():
                numpy_dtype(code)  # MissingExtraError (ml-dtypes) before reading the file
            for name, info in st.deserialize(Path(path).read_bytes()):
                dt = numpy_dtype(codes[name])
                assert dt is not None
                tensors[name] = np.frombuffer(info["data"], dt).reshape(info["shape"])
    except st.SafetensorError as exc:
        raise FormatError(f"{path}: not a readable .safetensors file ({exc})") from exc
    if not tensors:
        raise FormatError(f"{path}: the .safetensors file holds no tensors")
    for name, array in tensors.items():
        if dtype_code(array.dtype) != codes[name]:  # a loader that maps a dtype differently
            raise FormatError(
                f"{path}: tensor {name!r} is {kinds[name]} but was read as {array.dtype}"
            )
    return Gradient(tensors, dict(meta or {}))


def write_safetensors(stream: BinaryIO, gradient: Gradient) -> None:
    """Write the tensors as a ``.safetensors`` file to ``stream`` (meta is not kept; the
    stream need not seek). Every tensor is checked to be storable before anything is
    written (FormatError); MissingExtraError without the ``safetensors`` extra."""
    shown = stream_name(stream)
    check_names(shown, gradient)
    copy_safetensors(stream, safetensors_arrays(shown, gradient), shown)


def safetensors_arrays(target: str | Path, gradient: Gradient) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays to write, each checked to be storable (before anything is opened)."""
    _package()
    arrays = {}
    for name, value in gradient.tensors.items():
        array = np.asarray(value, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
        if dtype_code(array.dtype) is None:
            raise FormatError(f"{target}: tensor {name!r} has dtype {array.dtype}, not storable")
        arrays[name] = array
    return arrays


def write_safetensors_file(
    path: Path, arrays: dict[str, np.ndarray[Any, Any]], shown: str | Path
) -> None:
    """Write ``arrays`` as a ``.safetensors`` file at exactly ``path`` (a file being built).

    The written header is read back and checked against the arrays' dtypes; errors name
    ``shown`` (the path the user gave).
    """
    st = _package()
    try:
        st.numpy.save_file(arrays, str(path))
        with st.safe_open(str(path), framework="np") as f:
            for name, array in arrays.items():
                kind = f.get_slice(name).get_dtype()
                if kind != _KINDS[str(dtype_code(array.dtype))]:
                    raise FormatError(
                        f"{shown}: safetensors wrote tensor {name!r} ({dtype_code(array.dtype)}) "
                        f"as {kind}"
                    )
    except st.SafetensorError as exc:
        raise FormatError(f"{shown}: safetensors cannot write these tensors ({exc})") from exc


def copy_safetensors(
    stream: BinaryIO, arrays: dict[str, np.ndarray[Any, Any]], shown: str | Path
) -> None:
    """Write ``arrays`` as a ``.safetensors`` file to ``stream``: built in a temporary
    directory (``write_safetensors_file``), then copied a MiB at a time."""
    with tempfile.TemporaryDirectory(prefix="gradstore-") as tmp:
        built = Path(tmp) / "out.safetensors"
        write_safetensors_file(built, arrays, shown)
        with open(built, "rb") as f:
            shutil.copyfileobj(f, stream, 1 << 20)


def _code(path: str | Path, name: str, kind: str) -> str:
    code = CODES.get(kind)
    if code is None:
        raise FormatError(
            f"{path}: tensor {name!r} is {kind}, which gradstore/1 cannot hold "
            f"(it holds {' '.join(CODES)})"
        )
    return code
