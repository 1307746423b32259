"""The README's Flower command, run as a user runs it: Flower's own SuperLink and SuperNodes,
a real Kubo (the test's, found at $GRADSTORE_API), and every printed record audited."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gradstore.audit import fetch_record
from gradstore.dag import CID
from gradstore.node import KuboDaemon

ROOT = Path(__file__).resolve().parents[2]
ROUND = re.compile(
    r"^gradstore round (\d+): (\d+) inputs, (\d+) refused, .* record (\S+)$", re.MULTILINE
)

pytestmark = pytest.mark.slow


def _run(kubo: KuboDaemon, *args: str) -> str:
    env = {**os.environ, "GRADSTORE_API": kubo.api_url}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "flower" / "run.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"at {kubo.api_url}" in done.stdout.splitlines()[0]  # it used the Kubo that answered
    return done.stdout


def _verify(kubo: KuboDaemon, record: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "verify_round.py"), record, "--api", kubo.api_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _prev(kubo: KuboDaemon, record: str) -> CID | None:
    async def go() -> CID | None:
        async with kubo.node() as node:
            return (await fetch_record(node, record))[1].prev

    return asyncio.run(go())


def test_the_readme_command_runs_three_audited_rounds(kubo: KuboDaemon) -> None:
    out = _run(kubo)
    rounds = ROUND.findall(out)
    assert [int(r[0]) for r in rounds] == [1, 2, 3], out
    assert all(r[1:3] == ("2", "0") for r in rounds), out
    records = [r[3] for r in rounds]
    assert "0 B of client arrays over Flower" in out  # CID mode: the arrays went over IPFS
    for i, record in enumerate(records):
        _verify(kubo, record)  # scripts/verify_round.py re-derives each aggregate
        assert _prev(kubo, record) == (None if i == 0 else CID.parse(records[i - 1]))


def test_a_client_whose_cid_does_not_match_its_arrays_is_refused_and_the_round_goes_on(
    kubo: KuboDaemon,
) -> None:
    out = _run(kubo, "--liar", "--rounds", "1")
    rounds = ROUND.findall(out)
    assert [r[:3] for r in rounds] == [("1", "2", "1")], out
    refused = re.findall(r"^gradstore refused in round 1: (\S+): (.*)$", out, re.MULTILINE)
    assert len(refused) == 1, out
    assert refused[0][1].startswith("integrity: the arrays make document "), out
    _verify(kubo, rounds[0][3])

    async def excluded() -> list[tuple[str, str]]:
        async with kubo.node() as node:
            record = (await fetch_record(node, rounds[0][3]))[1]
            return [(e.peer, e.reason) for e in record.excluded]

    assert asyncio.run(excluded()) == [(refused[0][0], refused[0][1])]
