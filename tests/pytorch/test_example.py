"""``examples/torch/run.py``, run as a user runs it: a coordinator and TorchPeer peers training a
CNN on the digits over a real Kubo (the test's, found at $GRADSTORE_API), then the audit of the
whole history it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gradstore.node import KuboDaemon

ROOT = Path(__file__).resolve().parents[2]
ROUND = re.compile(
    r"^round (\d+): held-out accuracy ([\d.]+)%, (\d+) peers, record (\S+)$", re.MULTILINE
)
AUDIT = re.compile(r"^audit: (gradstore audit history (\S+) --api (\S+))$", re.MULTILINE)

pytestmark = [pytest.mark.kubo, pytest.mark.slow]


def test_the_example_trains_across_peers_and_its_history_audits(kubo: KuboDaemon) -> None:
    env = {**os.environ, "GRADSTORE_API": kubo.api_url}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "torch" / "run.py"),
         "--peers", "2", "--rounds", "3", "--local-epochs", "2"],
        capture_output=True, text=True, env=env, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].endswith(f"at {kubo.api_url}")  # the Kubo that answered
    rounds = ROUND.findall(done.stdout)
    assert [int(r[0]) for r in rounds] == [0, 1, 2], done.stdout  # the job's rounds, in order
    assert all(r[2] == "2" for r in rounds), done.stdout
    accuracies = [float(r[1]) / 100 for r in rounds]
    assert accuracies[-1] > accuracies[0] and accuracies[-1] >= 0.8, accuracies
    assert f"every peer holds the same model; last record {rounds[-1][3]}" in done.stdout
    audit = AUDIT.search(done.stdout)
    assert audit is not None, done.stdout
    assert audit.group(2) == rounds[-1][3] and audit.group(3) == kubo.api_url

    checked = subprocess.run(
        [sys.executable, "-m", "gradstore", *audit.group(1).split()[1:]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert re.search(
        r"^ok history of job torch-digits-\w+: 3 round\(s\), 2 down to 0", checked.stdout, re.M
    )
