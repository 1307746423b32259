"""CLI test fixtures: run ``main(argv)`` in-process and look at exit code, stdout, stderr apart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gradstore.cli import main

from .helpers import Run, sample_arrays, write_npz

Cli = Callable[..., Run]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``cli("put", path, "--local", d)`` -> Run; GRADSTORE_API*, IPFS_PATH unset: nothing leaks in."""
    monkeypatch.delenv("GRADSTORE_API", raising=False)
    monkeypatch.delenv("GRADSTORE_API_AUTH", raising=False)
    monkeypatch.delenv("IPFS_PATH", raising=False)
    capsys.readouterr()

    def run(*argv: object) -> Run:
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@pytest.fixture
def grad_npz(tmp_path: Path) -> Path:
    """A small gradient .npz of seeded random data (seed ``SEED``)."""
    return write_npz(tmp_path / "grad.npz", **sample_arrays())
