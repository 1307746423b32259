#!/usr/bin/env python3
"""How fast is the ``gradstore`` command against the ``ipfs`` command, as whole processes?

One run, one freshly started isolated Kubo daemon (own temporary repo, the
``unixfs-v1-2025`` profile, stopped at the end). Both commands run as users run
them: a new process each time (start-up included), with ``IPFS_PATH`` naming
the daemon's repo, so each finds the node the same way, and with Python's
bytecode caches as an installed package has them (``PYTHONDONTWRITEBYTECODE``
is dropped for the commands: the warm-up writes the caches of an editable install). For a float32 gradient
of each --sizes MiB (one tensor in an uncompressed ``.npz``) and its gradstore/1
document file (the same bytes ``gradstore put`` stores):

  put   ``gradstore put X.npz``            vs  ``ipfs add -Q DOC``   (pinned, fresh blocks)
  get   ``gradstore get CID -o Y.npz``     vs  ``ipfs cat CID > F``  (to a file on the same disk)
  cid   ``gradstore cid X.npz``            vs  ``ipfs add -Q --only-hash DOC``

Both sides of an operation print the same CID (checked on every run), so they
move the same bytes through the same node. Before every put, the CID is
unpinned and ``ipfs repo gc`` runs (not timed): each put stores fresh blocks.
Before every get, the output files are removed (not timed). The two sides
alternate, the first side switching each repetition; each size starts with
one untimed warm-up of each command. Times are the best and the median of
--repeat runs per side (the machine is shared and noisy: both are shown);
ratios are gradstore / ipfs. Targets (issue 12): at 64 MiB and above within
1.25x, below within 3x, judged on the medians.

"floors" time processes that do nothing useful: the Python interpreter alone,
importing NumPy (which put, get and cid of plain arrays no longer load), a process
that imports asyncio and httpx (what the node layer talks to Kubo with) and sends
Kubo one request, the same request through httpx's blocking client and through the
standard library's ``http.client``, ``gradstore --version`` and ``ipfs version
--number``: the start-up costs no command can go below (put and get: the third; the
next two say what asyncio and httpx each cost of it).

    .venv/bin/python -m benchmarks cli
    options: --sizes 1,64,256 --repeat 5 --ops put,get,cid --json --kubo PATH
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import MiB, emit, kubo_binary, machine, start_daemons, table
from gradstore.format import Gradient, encode
from gradstore.node import KuboDaemon

SEED = 20250917
OPS = ("put", "get", "cid")
REFERENCE = {"put": "ipfs add", "get": "ipfs cat", "cid": "ipfs add --only-hash"}


def target(mib: int) -> float:
    """The issue's target ratio for a size: 1.25x at 64 MiB and above, 3x below."""
    return 1.25 if mib >= 64 else 3.0


def gradstore_command() -> list[str]:
    """The installed ``gradstore`` script next to this Python (else ``python -m gradstore``)."""
    script = Path(sys.executable).parent / "gradstore"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gradstore"]


class Bench:
    """One daemon, one scratch directory, and the two commands run against them."""

    def __init__(self, daemon: KuboDaemon, tmp: Path) -> None:
        self.daemon = daemon
        self.tmp = tmp
        self.gradstore = gradstore_command()
        env = dict(os.environ)
        # PYTHONDONTWRITEBYTECODE: a user's install has bytecode caches (pip writes them;
        # an editable install writes them on first run), so the warm-ups may write them here
        for name in ("GRADSTORE_API", "GRADSTORE_API_AUTH", "IPFS_API", "PYTHONDONTWRITEBYTECODE"):
            env.pop(name, None)
        env["IPFS_PATH"] = str(daemon.repo)
        env["IPFS_TELEMETRY"] = "off"
        self.env = env

    def run(self, argv: Sequence[str], stdout: Any = subprocess.PIPE) -> tuple[float, str]:
        """Run one process to its end; its wall time and its stdout (stripped)."""
        start = time.perf_counter()
        done = subprocess.run(
            list(argv), env=self.env, stdout=stdout, stderr=subprocess.PIPE, check=False
        )
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(
                f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace')}"
            )
        return seconds, (done.stdout or b"").decode().strip()

    def ipfs(self, *args: str, stdout: Any = subprocess.PIPE) -> tuple[float, str]:
        return self.run([str(self.daemon.binary), *args], stdout=stdout)

    def gs(self, *args: str) -> tuple[float, str]:
        return self.run([*self.gradstore, *args])

    def drop(self, cid: str) -> None:
        """Unpin ``cid`` (if pinned) and collect garbage: the next put stores fresh blocks."""
        self.daemon.run("pin", "rm", cid, check=False)
        self.daemon.run("repo", "gc", "--quiet", timeout=600)


def make_inputs(tmp: Path, mib: int) -> tuple[Path, Path]:
    """``grad-N.npz`` (one float32 tensor) and ``grad-N.doc`` (its gradstore/1 document)."""
    rng = np.random.default_rng(SEED + mib)
    array = rng.standard_normal(mib * MiB // 4, dtype=np.float32)
    npz = tmp / f"grad-{mib}.npz"
    doc = tmp / f"grad-{mib}.doc"
    np.savez(npz, grad=array)
    with open(doc, "wb") as f:
        encode(Gradient({"grad": array})).write_to(f)
    return npz, doc


def alternate(
    repeat: int,
    ours: Callable[[], float],
    ref: Callable[[], float],
    before: Callable[[], None] = lambda: None,
) -> tuple[list[float], list[float]]:
    """``repeat`` timings of each side, the first side switching every repetition."""
    mine: list[float] = []
    theirs: list[float] = []
    for r in range(repeat):
        pair = [(ours, mine), (ref, theirs)]
        for fn, into in pair if r % 2 == 0 else reversed(pair):
            before()
            into.append(fn())
    return mine, theirs


def measure_size(bench: Bench, mib: int, ops: Sequence[str], repeat: int) -> dict[str, Any]:
    npz, doc = make_inputs(bench.tmp, mib)
    size = doc.stat().st_size
    result: dict[str, Any] = {"mib": mib, "document_bytes": size, "ops": {}}
    _, cid = bench.ipfs("add", "-Q", "--only-hash", str(doc))

    def expect(what: str, got: str) -> None:
        if got != cid:
            raise SystemExit(f"{what} printed {got!r}, the document's CID is {cid}")

    def put_ours() -> float:
        seconds, out = bench.gs("put", str(npz))
        expect("gradstore put", out)
        return seconds

    def put_ref() -> float:
        seconds, out = bench.ipfs("add", "-Q", str(doc))
        expect("ipfs add", out)
        return seconds

    out_npz = bench.tmp / "out.npz"
    out_bin = bench.tmp / "out.bin"

    def get_ours() -> float:
        seconds, out = bench.gs("get", cid, "-o", str(out_npz))
        if out != str(out_npz):
            raise SystemExit(f"gradstore get printed {out!r}")
        return seconds

    def get_ref() -> float:
        with open(out_bin, "wb") as f:
            seconds, _ = bench.ipfs("cat", cid, stdout=f)
        if out_bin.stat().st_size != size:
            raise SystemExit(f"ipfs cat wrote {out_bin.stat().st_size} bytes, expected {size}")
        return seconds

    def remove_outputs() -> None:
        out_npz.unlink(missing_ok=True)
        out_bin.unlink(missing_ok=True)

    def cid_ours() -> float:
        seconds, out = bench.gs("cid", str(npz))
        expect("gradstore cid", out)
        return seconds

    def cid_ref() -> float:
        seconds, out = bench.ipfs("add", "-Q", "--only-hash", str(doc))
        expect("ipfs add --only-hash", out)
        return seconds

    Side = tuple[Callable[[], float], Callable[[], float], Callable[[], None]]
    sides: dict[str, Side] = {
        "put": (put_ours, put_ref, lambda: bench.drop(cid)),
        "get": (get_ours, get_ref, remove_outputs),
        "cid": (cid_ours, cid_ref, lambda: None),
    }
    if "get" in ops:  # get needs the blocks; the last put leaves them pinned
        bench.ipfs("add", "-Q", str(doc))
    for op in ops:
        ours, ref, before = sides[op]
        before()
        ours()  # warm-up, not timed
        if op == "get":  # the output holds the same tensor
            with np.load(out_npz) as back, np.load(npz) as given:
                if not np.array_equal(back["grad"], given["grad"]):
                    raise SystemExit("gradstore get wrote a different tensor")
        before()
        ref()
        mine, theirs = alternate(repeat, ours, ref, before)
        remove_outputs()
        if op == "put":  # leave the blocks for a get that follows
            bench.ipfs("add", "-Q", str(doc))
        result["ops"][op] = {"gradstore": mine, "ipfs": theirs}
    bench.drop(cid)
    npz.unlink()
    doc.unlink()
    return result


ONE_REQUEST = """
import sys
sys.modules["httpx._main"] = None  # as gradstore's commands do (click, rich: unused)
import asyncio, httpx
async def main():
    async with httpx.AsyncClient(verify=False) as client:  # as KuboNode on http://
        (await client.post(sys.argv[1] + "/api/v0/version")).raise_for_status()
asyncio.run(main())
"""
"""The least a put or get in Python with asyncio and httpx can take: start, import them,
send one request to Kubo and read its answer."""

ONE_REQUEST_SYNC = """
import sys
sys.modules["httpx._main"] = None
import httpx
with httpx.Client(verify=False) as client:
    client.post(sys.argv[1] + "/api/v0/version").raise_for_status()
"""
"""The same request through httpx's blocking client, without asyncio (and anyio)."""

ONE_REQUEST_STDLIB = """
import sys, http.client, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
conn = http.client.HTTPConnection(url.hostname, url.port)
conn.request("POST", "/api/v0/version")
assert conn.getresponse().read()
"""
"""The same request through the standard library alone: what httpx itself costs."""


def measure_floors(bench: Bench, repeat: int) -> dict[str, list[float]]:
    """Start-up alone: the interpreter, with what put/get/cid cannot do without, and Kubo's."""
    python = sys.executable
    floors: dict[str, list[str]] = {
        "python -c pass": [python, "-c", "pass"],
        "python -c 'import numpy'": [python, "-c", "import numpy"],
        "python: asyncio + httpx, 1 request": [python, "-c", ONE_REQUEST, bench.daemon.api_url],
        "python: httpx, 1 request": [python, "-c", ONE_REQUEST_SYNC, bench.daemon.api_url],
        "python: http.client, 1 request": [python, "-c", ONE_REQUEST_STDLIB, bench.daemon.api_url],
        "gradstore --version": [*bench.gradstore, "--version"],
        "ipfs version --number": [str(bench.daemon.binary), "version", "--number"],
    }
    times: dict[str, list[float]] = {name: [] for name in floors}
    for _ in range(repeat):
        for name, argv in floors.items():
            times[name].append(bench.run(argv)[0])
    return times


def summary(times: list[float]) -> tuple[float, float]:
    return min(times), statistics.median(times)


def report(data: dict[str, Any]) -> str:
    rows: list[list[str]] = []
    verdicts: list[str] = []
    for entry in data["sizes"]:
        mib, size = entry["mib"], entry["document_bytes"]
        for op, sides in entry["ops"].items():
            ours_best, ours_med = summary(sides["gradstore"])
            ref_best, ref_med = summary(sides["ipfs"])
            ratio = ours_med / ref_med
            goal = target(mib)
            ok = ratio <= goal
            verdicts.append(f"{op} {mib} MiB {'ok' if ok else 'MISSED'}")
            rows.append(
                [
                    f"{op} {mib} MiB",
                    f"{ours_med:.3f}",
                    f"{ours_best:.3f}",
                    f"{size / ours_med / 1e6:,.0f}",
                    f"{ref_med:.3f}",
                    f"{ref_best:.3f}",
                    f"{size / ref_med / 1e6:,.0f}",
                    f"{ours_best / ref_best:.2f}",
                    f"{ratio:.2f}",
                    f"<= {goal:g}",
                ]
            )
    lines = [
        f"gradstore vs ipfs (Kubo {data['kubo']}), whole processes, {data['repeat']} runs per "
        f"side, load {data['machine']['loadavg']} before, {data['load_after']} after",
        "",
        table(
            [
                "operation",
                "gs med s",
                "gs best s",
                "gs MB/s",
                "ipfs med s",
                "ipfs best s",
                "ipfs MB/s",
                "best x",
                "median x",
                "target",
            ],
            rows,
        ),
        "",
        "MB/s: document bytes / median seconds. reference: put = ipfs add, "
        "get = ipfs cat > file, cid = ipfs add --only-hash",
    ]
    floors = data.get("floors")
    if floors:
        lines += [
            "",
            table(
                ["floor", "median s", "best s"],
                [
                    [name, f"{statistics.median(v):.3f}", f"{min(v):.3f}"]
                    for name, v in floors.items()
                ],
            ),
        ]
    lines += ["", "targets (median ratio): " + ", ".join(verdicts)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument(
        "--sizes", default="1,64,256", help="gradient sizes in MiB, comma-separated"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs per side and operation")
    parser.add_argument("--ops", default=",".join(OPS), help="operations: put,get,cid")
    parser.add_argument("--no-floors", action="store_true", help="skip the start-up floors")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--kubo", help="Kubo binary (default: $GRADSTORE_KUBO, PATH, cache)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    ops = [op for op in args.ops.split(",") if op]
    unknown = set(ops) - set(OPS)
    if unknown or not ops or not sizes or min(sizes) < 1 or args.repeat < 1:
        parser.error("--ops from put,get,cid; --sizes and --repeat positive")

    binary = kubo_binary(args.kubo)
    info = machine()
    (daemon,) = start_daemons(binary, 1)
    tmp = Path(tempfile.mkdtemp(prefix="gradstore-bench-cli-"))
    try:
        bench = Bench(daemon, tmp)
        version = bench.ipfs("version", "--number")[1]
        data: dict[str, Any] = {
            "kubo": version,
            "repeat": args.repeat,
            "command": bench.gradstore,
            "machine": info,
            "sizes": [measure_size(bench, mib, ops, args.repeat) for mib in sizes],
        }
        if not args.no_floors:
            data["floors"] = measure_floors(bench, args.repeat)
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    data["load_after"] = [round(x, 2) for x in os.getloadavg()]
    emit(data, args.json, report)


if __name__ == "__main__":
    main()
