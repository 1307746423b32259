"""``gradstore round show`` says what a round/4 record's number means: a coordinator counts a
job's rounds from 0, Flower (whose ``server_round`` a GradstoreStrategy records as is) from 1.
tests/flower/test_numbering.py shows it on a record a strategy wrote."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from gradstore.cli._round_show import numbering
from gradstore.dag import CID
from gradstore.format import Gradient
from gradstore.node import LocalNode

from ..audit.rounds import signed_round
from .conftest import Cli


def _record(node_dir: Path, round_: int, prev: CID | None = None) -> CID:
    async def go() -> CID:
        async with LocalNode(node_dir) as node:
            gradients = [Gradient({"w": np.full(3, i, np.float32)}, {}) for i in (1.0, 2.0)]
            return (
                await signed_round(node, gradients, [1, 2], round_=round_, prev=prev)
            ).record_cid

    return asyncio.run(go())


def test_round_show_gives_both_readings_of_a_records_number(cli: Cli, tmp_path: Path) -> None:
    node = tmp_path / "node"
    first = _record(node, 0)
    later = _record(node, 2, prev=first)
    shown = [json.loads(cli("round", "show", cid, "--local", node).out) for cid in (first, later)]
    assert [s["round"] for s in shown] == [0, 2]
    assert shown[0]["numbering"] == {
        "coordinator": "the job's 1st round, when a gradstore coordinator wrote it (it counts from 0)",
        "flower": "none: Flower trains from server_round 1, so a Flower run has no round 0",
    }
    assert shown[1]["numbering"] == {
        "coordinator": "the job's 3rd round, when a gradstore coordinator wrote it (it counts from 0)",
        "flower": "Flower's server_round 2, when a GradstoreStrategy wrote it (Flower counts from 1)",
    }


@pytest.mark.parametrize(
    ("round_", "nth"),
    [(1, "2nd"), (10, "11th"), (11, "12th"), (20, "21st"), (21, "22nd"), (110, "111th")],
)
def test_ordinals(round_: int, nth: str) -> None:
    assert numbering(round_)["coordinator"].startswith(f"the job's {nth} round")
