"""put and cid read an ``.npz`` of plain arrays while its document is hashed: the same CID as
reading it whole, a few stretches of it in memory at a time, and a damaged file fails
before any root exists."""

from __future__ import annotations

import asyncio
import os
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.dag import file_cid
from gradstore.errors import FormatError
from gradstore.files import NpzStream, _npz_stream, _stored_zip, load_npz, open_gradient
from gradstore.format import encode
from gradstore.node import LocalNode

from .conftest import Cli
from .helpers import SEED


def _float_arrays(n: int = 50_000) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(SEED)
    return {
        "b.weight": rng.standard_normal((n // 100, 100)).astype(np.float32),
        "a.bias": rng.standard_normal(n // 7),  # float64, and first in the document
        "c.steps": np.array(7, dtype=np.int64),
        "d.empty": np.zeros(0, np.float16),
    }


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"flags": np.array([True, False, True])},  # bool: read whole first
        {"f": np.asfortranarray(np.ones((3, 4)))},  # Fortran order: read whole first
        {"be": np.arange(6, dtype=">i4")},  # big-endian: read whole first
    ],
    ids=["streamed", "bool", "fortran", "big-endian"],
)
def test_the_cid_is_that_of_the_file_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]
) -> None:
    monkeypatch.setattr(_stored_zip, "CHUNK", 4096)  # many progress steps
    monkeypatch.setattr(_npz_stream, "STEP", 3 * 4096 + 5)  # stretches not on chunk bounds
    path = tmp_path / "g.npz"
    np.savez(path, **_float_arrays(), **extra)
    expected = file_cid(encode(load_npz(path)))
    with open_gradient(path) as npz:
        assert isinstance(npz, NpzStream) is (not extra)  # streamed, or read whole
        assert file_cid(npz.document()) == expected
    with open_gradient(path) as npz:  # the pieces, as the store sends them
        assert b"".join(bytes(p) for p in npz.document()) == encode(load_npz(path)).tobytes()


def test_compressed_files_are_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "z.npz"
    np.savez_compressed(path, **_float_arrays())
    assert NpzStream.open(path) is None
    with open_gradient(path) as npz:
        assert file_cid(npz.document()) == file_cid(encode(load_npz(path)))


def test_a_big_file_is_hashed_a_few_stretches_at_a_time(tmp_path: Path) -> None:
    """Memory stays bounded by the stretches in flight, not the file (64 MiB here): reading
    it into arrays first took all of it, in fresh pages that cost more than the reading."""
    path = tmp_path / "big.npz"
    np.savez(path, w=np.random.default_rng(SEED).standard_normal(8 << 20))  # 64 MiB
    npz = _stream(path)
    with npz:
        expected = file_cid(encode(load_npz(path)))
        tracemalloc.start()
        try:
            got = file_cid(npz.document())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert got == expected
    assert peak < 24 << 20, f"{peak >> 20} MiB traced for a 64 MiB file"


def test_a_file_cut_short_after_it_was_opened_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "g.npz"
    np.savez(path, w=np.arange(1 << 20, dtype=np.float32))
    with _stream(path) as npz:
        doc = npz.document()
        os.truncate(path, path.stat().st_size // 2)
        with pytest.raises(FormatError, match=r"g\.npz: truncated: the file ends"):
            file_cid(doc)
        assert npz.failure() is not None


def test_an_empty_member_with_a_damaged_header_fails_its_crc(tmp_path: Path) -> None:
    """No data of it is ever read: its CRC-32 is checked before the document is given."""
    path = tmp_path / "g.npz"
    np.savez(path, a=np.zeros(0, np.float32), b=np.ones(3, np.float32))
    data = bytearray(path.read_bytes())
    at = data.index(b"(0,), }") + len(b"(0,), }")  # the spaces NumPy pads the header with
    assert data[at] == 0x20
    data[at] = 0x09  # a tab: the header still parses, the bytes are not the ones stored
    path.write_bytes(bytes(data))
    npz = _stream(path)
    with npz, pytest.raises(FormatError, match="member 'a' fails its CRC-32 check"):
        npz.document()


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40  # in the middle of the data
    path.write_bytes(bytes(data))


def test_a_damaged_file_fails_cid_and_put_and_nothing_is_pinned(cli: Cli, tmp_path: Path) -> None:
    """The CRC-32 check comes before the member's last stretch is handed on (every other
    byte is hashed and sent by then): no root is ever computed, pinned or printed."""
    path = tmp_path / "g.npz"
    np.savez(path, w=np.random.default_rng(SEED).standard_normal(400_000).astype(np.float32))
    _damage(path)
    line = cli("cid", path).one_error_line()
    assert "fails its CRC-32 check" in line and str(path) in line
    node = tmp_path / "node"
    line = cli("put", path, "--local", node).one_error_line()
    assert line.startswith(f"error: {path}: member 'w' fails its CRC-32 check"), line
    assert asyncio.run(LocalNode(node).pins()) == set()


def test_a_file_that_is_refused_is_refused_as_before(tmp_path: Path) -> None:
    path = tmp_path / "g.npz"
    np.savez(path, w=np.zeros(2, "V2"))  # raw bytes: what NumPy writes for bfloat16
    with pytest.raises(FormatError, match="is raw bytes"):
        open_gradient(path)
    path.write_text("not a zip")
    with pytest.raises(FormatError, match=r"not an \.npz file"):
        open_gradient(path)


def _stream(path: Path) -> NpzStream:
    """The file as a stream (it must be one: plain arrays only)."""
    npz = NpzStream.open(path)
    assert npz is not None
    return npz


def _npz_of(path: Path, members: dict[str, bytes]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _npy(header: str, data: bytes = b"") -> bytes:
    body = header.encode("latin1") + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body + data


@pytest.mark.parametrize(
    ("header", "data", "says"),
    [
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (True, 3), }", 12, "other things"),
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,", 12, "unreadable .npy header"),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4611686018427387904), }",
            0,
            "too big",
        ),
    ],
    ids=["bool-dimension", "python-2-fallback-fails", "zero-size-huge"],
)
def test_hostile_headers_are_one_clean_error_naming_the_file(
    cli: Cli, tmp_path: Path, header: str, data: int, says: str
) -> None:
    path = _npz_of(tmp_path / "h.npz", {"a.npy": _npy(header, bytes(data))})
    for command in ("cid", "put"):
        extra = ["--local", tmp_path / "node"] if command == "put" else []
        line = cli(command, path, *extra).one_error_line()
        assert line.startswith(f"error: {path}: "), line  # not "error: unexpected ..."
        assert says in line, line


@pytest.mark.parametrize("also", [{}, {"f": np.array([True])}], ids=["streamed", "read-whole"])
def test_a_tensor_name_the_format_refuses_is_refused_naming_the_file(
    cli: Cli, tmp_path: Path, also: dict[str, Any]
) -> None:
    path = tmp_path / "n.npz"
    np.savez(path, **{"../x": np.ones(3, np.float32)}, **also)
    line = cli("cid", path).one_error_line()
    assert line.startswith(f"error: {path}: tensor name '../x'"), line
