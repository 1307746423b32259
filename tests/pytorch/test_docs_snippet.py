"""docs/frameworks.md's TorchPeer program runs as printed: two peers (alice's copy and bob's),
a coordinator and a real Kubo, every round of the job in order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradstore.cli import main
from gradstore.node import KuboDaemon

pytestmark = [pytest.mark.kubo, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 6  # what the docs' `gradstore job init ... --rounds 6` asks for


def torchpeer_program(page: str) -> str:
    """The ``python`` block of the PyTorch section that opens a TorchPeer (before the
    section's subsections: streaming has its own, run by test_streamed_round.py)."""
    section = page.split("\n## PyTorch\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M)
    (program,) = [b for b in blocks if "TorchPeer(" in b]
    return program


def _wait_subscribed(kubo: KuboDaemon, topic: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while topic not in kubo.run("pubsub", "ls").stdout.decode().split():
        assert proc.poll() is None, "the coordinator exited early"
        assert time.monotonic() < deadline, f"nobody subscribed to {topic}"
        time.sleep(0.1)


def test_the_docs_torchpeer_program_runs_every_round(kubo: KuboDaemon, tmp_path: Path) -> None:
    page = (ROOT / "docs" / "frameworks.md").read_text()
    program = torchpeer_program(page)
    assert f"--rounds {ROUNDS}`" in page
    for name in ("coord", "alice", "bob"):
        assert main(["keygen", "--out", str(tmp_path / f"{name}.key")]) == 0
    name = f"snippet-{os.getpid()}"
    assert main(["job", "init", "--name", name, "--coordinator", str(tmp_path / "coord.key"),
                 "--peer", str(tmp_path / "alice.key"), "--peer", str(tmp_path / "bob.key"),
                 "--rounds", str(ROUNDS), "--out", str(tmp_path / "job.toml")]) == 0  # fmt: skip
    (tmp_path / "alice.py").write_text(program)
    (tmp_path / "bob.py").write_text(program.replace('"alice.key"', '"bob.key"'))
    env = {**os.environ, "GRADSTORE_API": kubo.api_url, "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "coord.log", "wb") as log:
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "gradstore", "coordinator", "--config", "job.toml",
             "--key", "coord.key", "--state", "state"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
        )  # fmt: skip
    try:
        _wait_subscribed(kubo, f"gradstore/v1/{name}/gradients", coordinator)
        peers = [
            subprocess.Popen(
                [sys.executable, f"{who}.py"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=tmp_path,
            )
            for who in ("alice", "bob")
        ]
        outputs = [p.communicate(timeout=300) for p in peers]
        for p, (out, err) in zip(peers, outputs, strict=True):
            assert p.returncode == 0, out + err
            assert re.fullmatch(rf"{ROUNDS} rounds, accuracy \d+%\n", out), out + err
        assert coordinator.wait(timeout=60) == 0, (tmp_path / "coord.log").read_text()
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.wait()
