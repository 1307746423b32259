"""The progress bar: on stderr, only when stderr is a terminal and the transfer is big."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

from gradstore.cli import main
from gradstore.cli._progress import ByteProgressBar

from .conftest import Cli
from .helpers import SEED, write_npz

MB = 1 << 20


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_draws_on_a_tty_for_big_transfers() -> None:
    stream = FakeTTY()
    bar = ByteProgressBar("put", stream)
    bar(0, 64 * MB)
    bar(64 * MB, 64 * MB)  # the final update is always drawn
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\rput [")
    assert "[" + "#" * 30 + "] 67.1/67.1 MB" in text
    assert text.endswith(" MB/s\n")


def test_bar_is_silent_when_not_a_tty() -> None:
    stream = io.StringIO()
    bar = ByteProgressBar("get", stream)
    bar(64 * MB, 64 * MB)
    bar.close()
    assert stream.getvalue() == ""


def test_bar_is_silent_for_small_transfers() -> None:
    stream = FakeTTY()
    bar = ByteProgressBar("get", stream)
    bar(1 * MB, 1 * MB)
    bar.close()
    assert stream.getvalue() == ""  # no bar and no stray newline


def test_force_draws_without_a_tty() -> None:
    stream = io.StringIO()
    bar = ByteProgressBar("put", stream, force=True)
    bar(32 * MB, 64 * MB)
    assert "[" + "#" * 15 + " " * 15 + "]" in stream.getvalue()


def test_a_shorter_line_overwrites_a_longer_one() -> None:
    stream = FakeTTY()
    bar = ByteProgressBar("get", stream)
    bar(64 * MB, 64 * MB)
    first = stream.getvalue()
    bar._last = 0.0  # let the next update through the 10-per-second throttle
    bar(16 * MB, 0)
    second = stream.getvalue()[len(first) :]
    assert len(second) == len(first)  # padded with spaces, no leftover characters


def test_unknown_total_shows_bytes_only() -> None:
    stream = FakeTTY()
    bar = ByteProgressBar("get", stream)
    bar(16 * MB, 0)
    assert "\rget 16.8 MB " in stream.getvalue() and "[" not in stream.getvalue()


def _big_npz(tmp_path: Path) -> Path:
    rng = np.random.default_rng(SEED)
    return write_npz(tmp_path / "big.npz", w=rng.standard_normal(12 * MB // 4).astype(np.float32))


def test_put_and_get_draw_the_bar_on_a_terminal_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    big, node = _big_npz(tmp_path), tmp_path / "node"

    def run_on_tty(*argv: object) -> tuple[str, str]:
        tty = FakeTTY()
        with monkeypatch.context() as m:
            m.setattr(sys, "stderr", tty)
            assert main([str(a) for a in argv]) == 0
        return capsys.readouterr().out, tty.getvalue()

    cid_line, drawn = run_on_tty("put", big, "--local", node)
    assert cid_line.count("\n") == 1  # stdout holds only the result
    assert drawn.startswith("\rput ") and drawn.endswith(" MB/s\n"), drawn[-200:]
    assert f"\rput [{'#' * 30}] 12.6/12.6 MB" in drawn

    out, drawn = run_on_tty("get", cid_line.strip(), "-o", tmp_path / "back.npz", "--local", node)
    assert out == f"{tmp_path / 'back.npz'}\n"
    assert drawn.startswith("\rget ") and drawn.endswith(" MB/s\n"), drawn[-200:]
    assert f"\rget [{'#' * 30}] 12.6/12.6 MB" in drawn


def test_put_draws_nothing_when_stderr_is_not_a_terminal(cli: Cli, tmp_path: Path) -> None:
    r = cli("put", _big_npz(tmp_path), "--local", tmp_path / "node")
    assert r.code == 0 and r.err == ""
