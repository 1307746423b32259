"""Until Flower's strategy runs steps (issue 19), a job with [[steps]] is refused by it, never
run as one round that ignores every step's peers and method. The coordinator runs steps
(tests/coordinator/test_steps.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradstore.coordinator import Coordinator
from gradstore.errors import CoordinatorError
from gradstore.job import parse_job
from gradstore.messages import SigningKey
from gradstore.node import LocalNode

KEY = SigningKey.from_seed(bytes([200]) * 32)
PEERS = sorted(SigningKey.from_seed(bytes([i + 1]) * 32).did for i in range(2))


def _stepped() -> dict[str, object]:
    return {
        "job": "j",
        "coordinator": KEY.did,
        "peers": PEERS,
        "steps": [
            {"name": "head", "tensors": ["fc.*"], "peers": PEERS[:1]},
            {"name": "body", "tensors": ["conv.*"]},
        ],
    }


def test_the_coordinator_runs_a_job_with_steps(tmp_path: Path) -> None:
    coordinator = Coordinator(parse_job(_stepped()), KEY, LocalNode(tmp_path / "node"), tmp_path)
    assert list(coordinator.state.steps) == ["head", "body"]


def test_the_flower_strategy_refuses_a_job_with_steps(tmp_path: Path) -> None:
    from gradstore.flower import GradstoreStrategy

    with pytest.raises(CoordinatorError, match=r"\[\[steps\]\].*does not run yet"):
        GradstoreStrategy(node=LocalNode(tmp_path), key=KEY, config=parse_job(_stepped()))


def test_a_job_without_steps_still_builds_a_coordinator(tmp_path: Path) -> None:
    raw = _stepped()
    del raw["steps"]
    Coordinator(parse_job(raw), KEY, LocalNode(tmp_path / "node"), tmp_path)
