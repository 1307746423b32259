"""Helpers for the CLI tests: one invocation's outcome, seeded sample gradients, a dead URL."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SEED = 20240611


@dataclass(frozen=True)
class Run:
    """One ``gradstore`` invocation's outcome."""

    code: int
    out: str
    err: str

    @property
    def line(self) -> str:
        """stdout's only line (commands print one result)."""
        lines = self.out.splitlines()
        assert len(lines) == 1, f"expected one stdout line, got {self.out!r}"
        return lines[0]

    def one_error_line(self, code: int = 1) -> str:
        """Assert the failure contract (exit ``code``, nothing on stdout, one ``error:`` line).

        1 is a failure, 2 a wrong command line (README, "Exit codes").
        """
        assert self.code == code, (self.code, self.out, self.err)
        assert self.out == ""
        lines = self.err.splitlines()
        assert len(lines) == 1, f"expected one stderr line, got {self.err!r}"
        assert lines[0].startswith("error: ")
        assert "Traceback" not in self.err
        return lines[0]


def write_npz(path: Path, **arrays: Any) -> Path:
    """An uncompressed .npz written by NumPy itself (what users hand us)."""
    np.savez(path, **arrays)
    return path


def sample_arrays(seed: int = SEED) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return {
        "layer1.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "layer1.bias": rng.standard_normal(8),
        "steps": np.array(7, dtype=np.int64),
    }


def unused_url() -> str:
    """An http URL on loopback where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
