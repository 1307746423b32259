"""``.npz`` files: read as ``np.load`` reads them, written so that NumPy, ``zipfile`` and
``unzip`` read them back, CRC-32 checked both ways, and damaged or hostile archives refused."""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.errors import FormatError
from gradstore.files import SequentialWriter, _stored_zip, load_npz, write_npz
from gradstore.format import Gradient

SEED = 20240611


def _arrays() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(SEED)
    return {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "fortran": np.asfortranarray(rng.standard_normal((5, 6))),
        "scalar": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 3), np.float16),
        "big-endian": np.arange(5, dtype=">i4"),
        "flags": np.array([True, False]),
        "poids-é": rng.integers(0, 9, 4, dtype=np.uint8),  # a UTF-8 member name
    }


def _same(got: dict[str, np.ndarray[Any, Any]], want: dict[str, np.ndarray[Any, Any]]) -> None:
    assert got.keys() == want.keys()
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)


def _np_load(path: Path | io.BytesIO) -> dict[str, np.ndarray[Any, Any]]:
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_load_gives_what_np_load_gives(tmp_path: Path, save: Any) -> None:
    path = tmp_path / "in.npz"
    save(path, **_arrays())
    _same(load_npz(path).tensors, _np_load(path))


def test_a_member_larger_than_a_chunk_is_read_whole_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_stored_zip, "CHUNK", 4096)  # many chunks: the CRC runs alongside
    big = np.random.default_rng(SEED).standard_normal(100_003).astype(np.float32)
    path = tmp_path / "big.npz"
    np.savez(path, big=big)
    _same(load_npz(path).tensors, {"big": big})
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the middle of the data
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="fails its CRC-32 check"):
        load_npz(path)


def _unzip_test(path: Path) -> None:
    """``unzip -t``, a reader that shares no code with Python's, when it is installed."""
    unzip = shutil.which("unzip")
    if unzip is not None:
        done = subprocess.run([unzip, "-t", str(path)], capture_output=True, text=True)
        assert done.returncode == 0 and "No errors detected" in done.stdout, done.stdout


@pytest.mark.parametrize("seekable", [True, False])
@pytest.mark.parametrize("zip64", [False, True])
def test_written_archives_read_back_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seekable: bool, zip64: bool
) -> None:
    """A file (CRC filled in afterwards) and a pipe (data descriptors), with and without the
    zip64 records that sizes over 2 GiB need (the limit lowered to reach them here)."""
    if zip64:
        monkeypatch.setattr(_stored_zip, "ZIP64_LIMIT", 10)
    monkeypatch.setattr(_stored_zip, "CHUNK", 64)  # the CRC thread runs for the larger arrays
    arrays = _arrays()
    path = tmp_path / "out.npz"
    if seekable:
        with open(path, "wb") as f:
            write_npz(f, Gradient(arrays))
    else:
        pipe = io.BytesIO()
        write_npz(SequentialWriter(pipe), Gradient(arrays))  # says it cannot seek
        path.write_bytes(pipe.getvalue())
    _same(_np_load(path), arrays)
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None  # every member's CRC-32
        flags = {info.filename: info.flag_bits for info in zf.infolist()}
        assert all(zf.getinfo(name).compress_type == zipfile.ZIP_STORED for name in flags)
    assert all(bool(bits & 0x08) is not seekable for bits in flags.values())
    _unzip_test(path)
    _same(load_npz(path).tensors, arrays)


def test_the_same_arrays_give_the_same_bytes(tmp_path: Path) -> None:
    outs = []
    for _ in range(2):
        buf = io.BytesIO()
        write_npz(buf, Gradient(_arrays()))
        outs.append(buf.getvalue())
    assert outs[0] == outs[1]


def test_an_array_that_is_not_contiguous_is_written_as_its_values(tmp_path: Path) -> None:
    strided = np.arange(20, dtype=np.float64)[::3]
    buf = io.BytesIO()
    write_npz(buf, Gradient({"s": strided}))
    buf.seek(0)
    _same(_np_load(buf), {"s": strided.copy()})


def _overlapping_members(path: Path) -> None:
    """A zip whose directory says member a's data runs on through member b."""
    body = io.BytesIO()
    np.lib.format.write_array(body, np.ones(1000, np.float32))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("a.npy", body.getvalue())
        zf.writestr("b.npy", body.getvalue())
    raw = bytearray(buf.getvalue())
    entry = raw.index(b"PK\x01\x02")  # a's central directory entry
    longer = len(body.getvalue()) + 100  # into b's local header
    struct.pack_into("<2L", raw, entry + 20, longer, longer)  # compressed, uncompressed size
    path.write_bytes(bytes(raw))


def test_members_that_share_bytes_are_refused(tmp_path: Path) -> None:
    """Entries over each other's bytes would read as more than the file holds (a zip bomb)."""
    path = tmp_path / "bomb.npz"
    _overlapping_members(path)
    with zipfile.ZipFile(path) as zf:
        a, b = zf.infolist()
        assert a.header_offset + a.file_size > b.header_offset
    with pytest.raises(FormatError, match="overlap"):
        load_npz(path)


def test_damaged_and_hostile_members_are_refused(tmp_path: Path) -> None:
    member = io.BytesIO()
    np.lib.format.write_array(member, np.ones(8, np.float32))
    good = member.getvalue()
    cases = {
        "truncated data": ("w.npy", good[:-4], "header declares 32 bytes of data"),
        "trailing data": ("w.npy", good + b"xx", "header declares 32 bytes of data"),
        "not npy": ("w.npy", b"just some bytes", "is not a .npy array"),
    }
    for label, (name, data, message) in cases.items():
        path = tmp_path / f"{label}.npz"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(name, data)
        with pytest.raises(FormatError, match=message):
            load_npz(path)
    path = tmp_path / "twice.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("w.npy", good)
        zf.writestr("w", good)  # np.load would name both "w"
    with pytest.raises(FormatError, match="two members hold the array 'w'"):
        load_npz(path)
    path = tmp_path / "cut.npz"
    np.savez(path, w=np.ones(100_000, np.float32))
    path.write_bytes(path.read_bytes()[:200_000])  # the directory is gone with the end
    with pytest.raises(FormatError, match=r"not an \.npz file"):
        load_npz(path)


def test_a_local_header_that_disagrees_with_the_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "renamed.npz"
    np.savez(path, w=np.ones(8, np.float32))
    data = bytearray(path.read_bytes())
    at = data.index(b"w.npy")  # the first one is the local header's
    data[at : at + 1] = b"v"
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="names another member"):
        load_npz(path)
