"""benchmarks/: one runner, ``python -m benchmarks <name> [args]``, over every benchmark, each
importing the shared helpers as a package with no ``sys.path`` edits (issue 26)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._link import can_shape

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py"))


def _runner(*args, timeout=120):
    """``python -m benchmarks ARGS`` from the repository root, as the README runs it."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_runner_lists_every_benchmark_with_what_it_measures():
    done = _runner("--list")
    assert done.returncode == 0, done.stderr
    rows = [line.split(maxsplit=1) for line in done.stdout.splitlines()]
    assert [row[0] for row in rows] == BENCHMARKS
    assert all(len(row) == 2 for row in rows), done.stdout  # a description each


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_takes_its_arguments_through_the_runner(name):
    done = _runner(name, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: "), done.stdout


def test_an_unknown_benchmark_is_refused_with_the_list():
    done = _runner("no-such-bench")
    assert done.returncode == 2
    assert "no benchmark 'no-such-bench'" in done.stderr and "\nstore " in done.stderr


def test_no_code_edits_sys_path():
    edits = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=")
    found = [
        str(path.relative_to(ROOT))
        for folder in ("benchmarks", "scripts", "examples", "src")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if edits.search(path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_announce_runs_at_its_smallest_size():
    done = _runner("announce", "--peers", "8", "--json")
    assert done.returncode == 0, done.stderr
    assert '"peers": 8' in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, args",
    [
        ("store", ["--mib", "1", "--repeat", "1"]),  # its peak-RSS probes are child processes
        ("memory", ["--peers", "2", "--mib", "1"]),  # its coordinator is a child process
        ("steps", ["--peers", "2", "--tensors", "2", "--repeat", "1"]),  # and so is this one's
        # its coordinators are child processes, the split's root and owner among them
        ("multicoord", ["--peers", "2", "--kib", "4", "--steps", "2", "--coordinators", "2"]),
        # one coordinator process per way (spill, then the Kubo re-read), then `audit round`
        ("scale", ["--peers", "2", "--mib", "1", "--audit"]),
    ],
)
def test_benchmarks_with_child_processes_run_at_their_smallest_size(kubo_binary, name, args):
    done = _runner(name, *args, "--kubo", str(kubo_binary), "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.lstrip().startswith("{"), done.stdout


@pytest.mark.slow
def test_steps_stream_runs_at_its_smallest_size(kubo_binary):
    """Its peers are spawned processes, its coordinators a thread: every side plays a round."""
    done = _runner(
        "steps_stream", "--width", "64", "--batch", "32", "--rounds", "1", "--warmup", "0",
        "--kubo", str(kubo_binary), "--json", timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert sorted(data["sides"]) == ["stepped", "streamed", "whole"]
    assert data["ratio"] > 0 and data["bytes"] == 8 * (64 * 64 + 64) * 4


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("tc") is None or not can_shape(),
    reason="shaping loopback needs root, tc, and HTB and bfifo in the kernel",
)
def test_steps_stream_runs_with_a_daemon_per_peer_on_a_shaped_link(kubo_binary):
    """--link-mbit: each peer on its own daemon, the coordinators fetching over bitswap."""
    done = _runner(
        "steps_stream", "--width", "64", "--batch", "32", "--rounds", "1", "--warmup", "0",
        "--link-mbit", "100", "--kubo", str(kubo_binary), "--json", timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert sorted(data["sides"]) == ["stepped", "streamed", "whole"] and data["ratio"] > 0
    assert (
        "htb"
        not in subprocess.run(
            ["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True
        ).stdout
    )
