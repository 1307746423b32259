"""The coordinator gets the aggregation kernel ready while inputs arrive, not at aggregate time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.coordinator import Coordinator, closing
from gradstore.node import LocalNode
from gradstore.peer import Peer

from .harness import gradients, make_job


def test_the_first_verified_input_prepares_the_kernel_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, coord, peers = make_job(2, method="mean", rounds=2, quorum=2, deadline_s=30)
    prepared: list[dict[str, Any]] = []

    def record(tensors: dict[str, Any]) -> bool:
        prepared.append(dict(tensors))
        return False

    monkeypatch.setattr(closing, "prepare", record)

    async def go() -> None:
        node = LocalNode(tmp_path / "node")
        coordinator = Coordinator(config, coord, node, tmp_path / "state", linger_s=0)
        running = asyncio.create_task(coordinator.run())
        for r in range(2):
            grads = gradients(2, r)
            async with Peer(config, node, peers[0]) as a, Peer(config, node, peers[1]) as b:
                await asyncio.gather(
                    a.publish(grads[0], r, num_samples=1, timeout=20),
                    b.publish(grads[1], r, num_samples=1, timeout=20),
                )
            if r == 0:
                sent = grads
        outcomes = await running
        assert [o.status for o in outcomes] == ["closed", "closed"]
        (tensors,) = prepared  # once per coordinator run, with one of round 0's inputs
        assert any(all(np.array_equal(tensors[n], g.tensors[n]) for n in g.tensors) for g in sent)

    asyncio.run(go())
