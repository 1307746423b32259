"""``-o`` never replaces what it names; ``-o -`` is stdout; names and text from the network are
made safe before they reach file names or the terminal."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.format import Gradient, encode

from .conftest import Cli
from .helpers import sample_arrays, write_npz


def _doc(tmp_path: Path, **meta: Any) -> Path:
    path = tmp_path / "doc"
    path.write_bytes(encode(Gradient(sample_arrays(), meta)).tobytes())
    return path


def _tensors(data: bytes) -> dict[str, np.ndarray[Any, Any]]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _same_as_sample(data: bytes) -> None:
    back = _tensors(data)
    expected = sample_arrays()
    assert back.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(back[name], array)


def _gradstore(*argv: object, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSTORE_API")}
    return subprocess.run(
        [sys.executable, "-m", "gradstore", *map(str, argv)],
        capture_output=kw.pop("stdout", None) is None,
        env=env,
        timeout=60,
        check=False,
        **kw,
    )


def test_dash_writes_the_npz_to_stdout_and_nothing_else(tmp_path: Path) -> None:
    done = _gradstore("decode", _doc(tmp_path), "-o", "-")
    assert done.returncode == 0 and done.stderr == b""
    _same_as_sample(done.stdout)  # a pipe: the zip is written without seeking
    assert not (tmp_path / "-").exists()
    done = _gradstore("encode", write_npz(tmp_path / "g.npz", **sample_arrays()), "-o", "-")
    assert done.returncode == 0 and done.stdout == _doc(tmp_path).read_bytes()


def test_dash_to_a_terminal_is_refused(tmp_path: Path) -> None:
    main_fd, term_fd = os.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gradstore", "decode", str(_doc(tmp_path)), "-o", "-"],
            stdout=term_fd,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(term_fd)
        os.close(main_fd)
    assert done.returncode == 2
    assert b"terminal" in done.stderr and done.stderr.count(b"\n") == 1


def test_a_symlink_is_followed_and_kept(cli: Cli, tmp_path: Path) -> None:
    real = tmp_path / "real.npz"
    real.write_bytes(b"old")
    real.chmod(0o640)
    link = tmp_path / "link.npz"
    link.symlink_to(real)
    assert cli("decode", _doc(tmp_path), "-o", link).line == str(link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    _same_as_sample(real.read_bytes())
    assert stat.S_IMODE(real.stat().st_mode) == 0o640  # the file's mode is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc", "link.npz", "real.npz"]


def _decode_into_a_fifo(cli: Cli, tmp_path: Path, name: str) -> bytes:
    """Run ``decode -o FIFO`` while a thread reads the FIFO; what the reader received."""
    fifo = tmp_path / name
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    try:
        assert cli("decode", _doc(tmp_path), "-o", fifo).code == 0
    finally:
        reader.join(30)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    return received[0]


def test_a_fifo_is_written_through(cli: Cli, tmp_path: Path) -> None:
    _same_as_sample(_decode_into_a_fifo(cli, tmp_path, "pipe.npz"))


def test_safetensors_to_a_fifo_is_written_through(cli: Cli, tmp_path: Path) -> None:
    from safetensors.numpy import load  # the safetensors extra: scripts/test installs it

    back = load(_decode_into_a_fifo(cli, tmp_path, "pipe.safetensors"))
    np.testing.assert_array_equal(back["layer1.weight"], sample_arrays()["layer1.weight"])


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a device file needs root")
def test_a_character_device_is_written_through_not_replaced(cli: Cli, tmp_path: Path) -> None:
    null = tmp_path / "null"  # a private /dev/null: what `-o /dev/stdout` as root used to hit
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert cli("decode", _doc(tmp_path), "-o", null).code == 0
    assert stat.S_ISCHR(null.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc", "null"]


@pytest.mark.parametrize("name", ["new.npz", "new.safetensors"])
def test_a_new_file_gets_the_mode_the_umask_allows_whatever_the_format(
    cli: Cli, tmp_path: Path, name: str
) -> None:
    # safetensors writes its own file; the one put in place must not be left 0600
    old = os.umask(0o022)
    try:
        assert cli("decode", _doc(tmp_path), "-o", tmp_path / name).code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644


def test_a_missing_folder_is_named_not_a_temporary_file(cli: Cli, tmp_path: Path) -> None:
    line = cli("decode", _doc(tmp_path), "-o", tmp_path / "nowhere" / "x.npz").one_error_line()
    assert str(tmp_path / "nowhere") in line and ".part" not in line


def test_a_directory_is_refused_before_any_work(cli: Cli, tmp_path: Path) -> None:
    node = tmp_path / "node"
    cid = cli("put", write_npz(tmp_path / "g.npz", **sample_arrays()), "--local", node).line
    line = cli("get", cid, "-o", tmp_path, "--local", node).one_error_line()
    assert line == f"error: {tmp_path}: Is a directory"


def _hostile_npz(path: Path, member: str) -> Path:
    """An .npz whose member name a hostile peer chose (np.savez would write it too)."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ones(3, np.float32))
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member + ".npy", buf.getvalue())
    return path


def test_an_npz_member_that_climbs_is_neither_stored_nor_written(cli: Cli, tmp_path: Path) -> None:
    evil = _hostile_npz(tmp_path / "evil.npz", "../../x")
    assert "'../../x' has a '..' path segment" in cli("cid", evil).one_error_line()
    line = cli("aggregate", "--method", "sum", evil, "-o", tmp_path / "out.npz").one_error_line()
    assert "'../../x' has a '..' path segment" in line
    assert not (tmp_path / "out.npz").exists()


def test_inspect_escapes_meta_keys_from_the_network(cli: Cli, tmp_path: Path) -> None:
    doc = _doc(tmp_path, **{"\x1b]0;owned\x07": 1, "note": "\x1b[2J"})
    r = cli("inspect", doc)
    assert r.code == 0
    assert "\x1b" not in r.out and "\x07" not in r.out
    assert "\\x1b]0;owned\\x07 = 1" in r.out


def test_error_lines_escape_control_characters(cli: Cli, tmp_path: Path) -> None:
    npz = write_npz(tmp_path / "g.npz", **sample_arrays())
    key = "\x1b]0;owned\x07"
    line = cli("cid", npz, "--meta", f"{key}=1", "--meta", f"{key}=2").one_error_line(2)
    assert "\x1b" not in line and "\\x1b]0;owned\\x07" in line
