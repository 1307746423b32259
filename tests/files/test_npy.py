"""The ``.npy`` headers read and written without NumPy: the same as NumPy's, or left to it."""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np
import pytest

from gradstore.files._npy import MAGIC, PLAIN, parse_plain, plain_header

SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 0, 5), (10**12,), tuple(range(1, 40))]


def _numpy_header(array: np.ndarray[Any, Any]) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()[: len(out.getvalue()) - array.nbytes]


@pytest.mark.parametrize("dtype", sorted(PLAIN | {"|b1"}))
@pytest.mark.parametrize("shape", SHAPES[:-2], ids=str)
def test_the_header_written_is_numpys_and_reads_back(dtype: str, shape: tuple[int, ...]) -> None:
    array = np.zeros(shape, np.dtype(dtype))
    header = plain_header(dtype, shape)
    assert header == _numpy_header(array)
    if dtype != "|b1":
        parsed = parse_plain(header)
        assert parsed is not None
        assert (parsed.dtype, parsed.shape, parsed.length) == (dtype, shape, len(header))
        assert parsed.nbytes == array.nbytes


@pytest.mark.parametrize("shape", SHAPES[-2:], ids=["huge", "rank-39"])
def test_long_and_huge_shapes_match_numpys_header(shape: tuple[int, ...]) -> None:
    """NumPy writes the header for a shape whatever its size: compare with its writer.
    Above rank 32 (NumPy 1.26's limit) reading is left to NumPy."""
    fields = {"descr": "<f4", "fortran_order": False, "shape": shape}
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, fields)
    assert plain_header("<f4", shape) == out.getvalue()
    parsed = parse_plain(out.getvalue())
    if len(shape) > 32:
        assert parsed is None
    else:
        assert parsed is not None and parsed.shape == shape


def test_a_header_too_long_for_1_0_is_written_as_numpy_2_0() -> None:
    shape = (1,) * 30_000
    fields = {"descr": "<f4", "fortran_order": False, "shape": shape}
    out = io.BytesIO()
    np.lib.format.write_array_header_2_0(out, fields)
    assert plain_header("<f4", shape) == out.getvalue()


def _header(text: str, version: tuple[int, int] = (1, 0)) -> bytes:
    body = text.encode("latin1") + b"\n"
    size = "<H" if version == (1, 0) else "<I"
    return MAGIC + bytes(version) + struct.pack(size, len(body)) + body


@pytest.mark.parametrize(
    "text",
    [
        "{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }",  # big-endian
        "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",  # bool: bytes checked
        "{'descr': '<V2', 'fortran_order': False, 'shape': (3,), }",  # raw bytes (bfloat16)
        "{'descr': '|O', 'fortran_order': False, 'shape': (3,), }",  # objects: pickles
        "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }",  # structured
        "{'descr': 'float32', 'fortran_order': False, 'shape': (3,), }",  # another spelling
        "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }",  # Fortran order
        "{'descr': '<f4', 'fortran_order': 0, 'shape': (3,), }",  # not a bool
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",  # negative
        "{'descr': '<f4', 'fortran_order': False, 'shape': (True,), }",  # a bool dimension
        "{'descr': '<f4', 'fortran_order': False, 'shape': [3], }",  # not a tuple
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3.0,), }",
        "{'descr': '<f4', 'fortran_order': False, }",  # a key missing
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}",  # one too many
        "['descr', '<f4']",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), } + 1",
        "__import__('os').system('true')",  # never evaluated, only parsed
        "(" * 10_000,
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }" + " " * 10_000,  # too long
    ],
)
def test_anything_but_a_plain_array_is_left_to_numpy(text: str) -> None:
    assert parse_plain(_header(text)) is None


def test_a_fortran_flag_on_one_axis_is_the_same_bytes_and_plain() -> None:
    parsed = parse_plain(_header("{'descr': '<i8', 'fortran_order': True, 'shape': (5,), }"))
    assert parsed is not None and parsed.shape == (5,)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x93NUMP",
        b"PK\x03\x04" + b"\x00" * 100,
        MAGIC + bytes((3, 0)) + b"\x00" * 100,  # version 3.0 (UTF-8 header): NumPy decides
        MAGIC + bytes((1, 0)) + b"\x40",  # length cut short
        _header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }")[:-10],  # cut
    ],
)
def test_truncated_or_foreign_bytes_are_left_to_numpy(raw: bytes) -> None:
    assert parse_plain(raw) is None


def test_version_2_0_headers_are_read() -> None:
    raw = _header("{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3), }", (2, 0))
    parsed = parse_plain(raw)
    assert parsed is not None and (parsed.dtype, parsed.shape) == ("<u2", (2, 3))


@pytest.mark.parametrize(
    "shape",
    [(0, 1 << 40, 1 << 40), (0, 1 << 63), (0, 1 << 64), (1,) * 33],
    ids=["zero-size-huge-extent", "zero-size-2**63", "zero-size-2**64", "rank-33"],
)
def test_shapes_numpy_cannot_hold_are_left_to_it(shape: tuple[int, ...]) -> None:
    """NumPy refuses these (an extent past its index type, more dimensions than NumPy 1.26
    has): taking them here would store what `get` cannot write back as an array."""
    assert (
        parse_plain(_header(f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"))
        is None
    )
