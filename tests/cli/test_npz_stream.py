"""put and cid read an ``.npz`` while its document is hashed: the same CID as reading it whole,
never a byte before it is read, and a damaged file fails before any root exists."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.cli import _npz_directory, _npz_stream, _stored_zip
from gradstore.cli._npz import load_npz
from gradstore.cli._npz_stream import NpzStream
from gradstore.dag import file_cid
from gradstore.errors import FormatError
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
    with NpzStream(path) as npz:
        doc = npz.document()
        assert (type(doc).__name__ == "_StreamedDocument") is (not extra)
        assert file_cid(doc) == expected
    with NpzStream(path) as npz:  # the pieces, as the store sends them
        assert b"".join(bytes(p) for p in npz.document()) == encode(load_npz(path)).tobytes()


def test_compressed_files_are_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "z.npz"
    np.savez_compressed(path, **_float_arrays())
    with NpzStream(path) as npz:
        assert file_cid(npz.document()) == file_cid(encode(load_npz(path)))


def test_hashing_starts_before_the_file_is_read_and_waits_for_each_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader is held after its first stretch: the document hands that stretch on, and
    no further, until the reader goes on."""
    monkeypatch.setattr(_stored_zip, "CHUNK", 1 << 16)
    monkeypatch.setattr(_npz_stream, "STEP", 1 << 16)
    path = tmp_path / "g.npz"
    np.savez(path, w=np.random.default_rng(SEED).standard_normal(1 << 17))  # 1 MiB of float64
    go_on = threading.Event()
    real = _npz_stream._Progress.announce

    def held(self: Any, index: int, n: int) -> None:
        real(self, index, n)
        if n >= 1 << 16:
            go_on.wait(30)

    monkeypatch.setattr(_npz_stream._Progress, "announce", held)
    with NpzStream(path) as npz:
        pieces = iter(npz.document())
        header = next(pieces)
        first = next(pieces)  # the first stretch of data, while the reader is held
        assert first.nbytes <= 1 << 16
        want = np.load(path)["w"].view(np.uint8)
        assert bytes(first) == want[: first.nbytes].tobytes()
        waiting = threading.Thread(target=lambda: next(pieces))
        waiting.start()
        waiting.join(0.3)
        assert waiting.is_alive()  # the next stretch is not in yet: it waits
        go_on.set()
        waiting.join(30)
        assert header.nbytes > 0


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40  # in the middle of the data
    path.write_bytes(bytes(data))


def test_a_damaged_file_fails_cid_and_put_and_nothing_is_pinned(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CRC-32 check is made late (every byte is in, hashed and sent by then): the last
    byte still waits for it, so no root is ever computed, pinned or printed."""
    real = _npz_directory.read_into

    def late_check(f: Any, out: memoryview, crc: int = 0, **kw: Any) -> int:
        value = real(f, out, crc, **kw)
        if len(out) > 1000:  # the data, not the .npy header
            time.sleep(0.5)
        return value

    monkeypatch.setattr(_npz_directory, "read_into", late_check)
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
        NpzStream(path)
    path.write_text("not a zip")
    with pytest.raises(FormatError, match=r"not an \.npz file"):
        NpzStream(path)
