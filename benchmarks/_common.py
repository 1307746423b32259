"""Shared helpers for the benchmarks in this folder.

Isolated Kubo daemons, best-of timing, peak-RSS probes and plain-text tables.
Not part of gradstore: the benchmarks import it as ``benchmarks._common``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gradstore.job import JobConfig, load_job
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, find_kubo_binary, stop_all

MiB = 1 << 20


def kubo_binary(explicit: str | None) -> Path:
    """``--kubo`` if given, else ``find_kubo_binary()`` (``$GRADSTORE_KUBO`` first)."""
    found = Path(explicit).expanduser() if explicit else find_kubo_binary()
    if found is None:
        sys.exit("no Kubo binary: set GRADSTORE_KUBO or pass --kubo (scripts/install-kubo.sh)")
    return found


def start_daemons(binary: Path, n: int, *, connect: bool = False) -> list[KuboDaemon]:
    """Start ``n`` fresh isolated daemons (own temporary repos), optionally swarm-connected."""
    daemons: list[KuboDaemon] = []
    try:
        for _ in range(n):
            daemons.append(KuboDaemon(binary).start())
        if connect:
            for i, daemon in enumerate(daemons):
                for other in daemons[i + 1 :]:
                    daemon.run("swarm", "connect", other.loopback_addr())
    except BaseException:
        stop_all(daemons)
        raise
    return daemons


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    load = os.getloadavg()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in load],
    }


class Clock:
    """``with clock: ...`` adds the elapsed wall time to ``seconds``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> Clock:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._start


# --- memory ---------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_rss() -> int:
    """Reset this process's peak RSS (VmHWM) to its current RSS; return that RSS in bytes.

    Writing ``5`` to ``/proc/self/clear_refs`` is Linux's documented way to
    restart the high-water mark, so a later ``peak_rss()`` covers only what
    ran in between.
    """
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS") * 1024


def peak_rss() -> int:
    """Peak RSS (VmHWM) in bytes since the last ``reset_peak_rss``."""
    return _status_kib("VmHWM") * 1024


def peak_rss_of(pid: int) -> int:
    """Another process's peak RSS (VmHWM) in bytes; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def one_round_job(
    n: int, method: str, max_bytes: int, path: Path, *, name: str, seed: int
) -> tuple[JobConfig, list[SigningKey]]:
    """A one-round job file of ``n`` seeded peers at ``path`` (all in the quorum, an hour's
    deadline, limits of ``max_bytes``), its coordinator's key beside it (``.key``)."""
    coord = SigningKey.from_seed(bytes([seed]) * 32)
    peers = [SigningKey.from_seed((i + 1).to_bytes(32, "big")) for i in range(n)]
    dids = ", ".join(f'"{k.did}"' for k in peers)
    extra = {"trimmed_mean": "trim_ratio = 0.25\n", "krum": "byzantine = 1\n"}.get(method, "")
    path.write_text(
        f'job = "{name}"\ncoordinator = "{coord.did}"\npeers = [{dids}]\n'
        f'[aggregation]\nmethod = "{method}"\n{extra}'
        f"[rounds]\ncount = 1\nquorum = {n}\ndeadline_s = 3600\n"
        f"[limits]\nmax_gradient_bytes = {max_bytes}\nmax_elements = {max_bytes}\n"
    )
    coord.save(path.with_suffix(".key"))
    return load_job(path), peers


# --- output ---------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain, aligned text table (first column left-aligned, the others right-aligned)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        parts = [
            row[i].ljust(widths[i]) if i == 0 else row[i].rjust(widths[i]) for i in range(len(row))
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def dump_json(data: dict[str, Any]) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def emit(data: dict[str, Any], as_json: bool, report: Callable[[dict[str, Any]], str]) -> None:
    """A benchmark's result on stdout: its data as JSON (``--json``), else its report."""
    if as_json:
        dump_json(data)
    else:
        print(report(data))
