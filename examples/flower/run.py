#!/usr/bin/env python3
"""Run the Flower example end to end on loopback, with Flower's own processes.

Starts a Flower SuperLink and two SuperNodes (``flower-superlink``, ``flower-supernode``),
uses the Kubo at $GRADSTORE_API when one answers there (else starts one from
``scripts/install-kubo.sh``'s build, with its own temporary repo), submits this directory's
Flower App with ``flwr run``, and prints one line per round ending with that round's
record CID (``scripts/verify_round.py CID`` re-derives it). Flower's own logs go to files
in a temporary directory, kept (and named) when something fails.

    python examples/flower/run.py [--rounds 3] [--send cid|arrays]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from gradstore.errors import NodeError
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, KuboNode, Retry, Timeouts, find_kubo_binary

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode and flwr live here
DEFAULT_API = "http://127.0.0.1:5001"
ROUND_MARK = "gradstore round "
OTHER_MARKS = ("gradstore refused", "gradstore run ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


async def _kubo_version(api: str) -> str | None:
    probe = KuboNode(
        api, timeouts=Timeouts(connect=2.0, read=5.0, write=5.0, pool=2.0), retry=Retry(retries=0)
    )
    try:
        return await probe.version()
    except NodeError:
        return None
    finally:
        await probe.aclose()


@contextlib.contextmanager
def kubo(api: str | None) -> Iterator[tuple[str, str]]:
    """(RPC URL, description): the Kubo at ``api``/$GRADSTORE_API if it answers, else our own."""
    url = api or os.environ.get("GRADSTORE_API") or DEFAULT_API
    version = asyncio.run(_kubo_version(url))
    if version is not None:
        yield url, f"kubo {version} at {url}"
        return
    binary = find_kubo_binary()
    if binary is None:
        raise SystemExit(
            f"error: no Kubo answers at {url} and none is installed "
            "(run scripts/install-kubo.sh, or set GRADSTORE_API)"
        )
    daemon = KuboDaemon(binary).start()
    try:
        yield daemon.api_url, f"kubo at {daemon.api_url} (started here; nothing answered at {url})"
    finally:
        daemon.stop()


class Processes:
    """Flower's processes, each in its own process group, stopped together (children too)."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs = logs
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115  (closed with the process)
        proc = subprocess.Popen(
            [str(BIN / argv[0]), *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.logs,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group: SuperExec and app processes
            proc.wait()


def toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument(
        "--send", choices=("cid", "arrays"), default="cid", help="what clients reply with"
    )
    parser.add_argument(
        "--liar",
        action="store_true",
        help="add a SuperNode whose client signs one CID and sends other arrays (it is refused)",
    )
    parser.add_argument("--api", help=f"Kubo RPC URL (default $GRADSTORE_API or {DEFAULT_API})")
    parser.add_argument("--app", type=Path, default=HERE, help="the Flower App to run")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="gradstore-flower-"))
    logs = work / "logs"
    logs.mkdir()
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(work / "flwr"),
        FLWR_TELEMETRY_ENABLED="0",  # the example talks to loopback only
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
    )
    procs = Processes(logs, env)
    ok = False
    try:
        with kubo(args.api) as (api, description):
            print(f"node: {description}", flush=True)
            coordinator = work / "coordinator.pem"
            SigningKey.generate().save(coordinator)
            link = free_port()
            superlink = procs.start(
                "superlink",
                "flower-superlink",
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(link),
            )
            wait_for_port(link, superlink, "flower-superlink", 60)
            nodes = args.clients + (1 if args.liar else 0)
            for i in range(nodes):
                key = work / f"client{i}.pem"
                SigningKey.generate().save(key)
                liar = i == args.clients
                node_config = " ".join(
                    (
                        f"partition-id={i % args.clients}",
                        f"num-partitions={args.clients}",
                        f"gradstore-key={toml_string(str(key))}",
                        f"gradstore-api={toml_string(api)}",
                        f"gradstore-send={toml_string('arrays' if liar else args.send)}",
                        *(["gradstore-lie=true"] if liar else []),
                    )
                )
                procs.start(
                    f"supernode{i}",
                    "flower-supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{link}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    node_config,
                )
            (work / "flwr").mkdir(exist_ok=True)
            (work / "flwr" / "config.toml").write_text(
                '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                f'address = "127.0.0.1:{link}"\ninsecure = true\n'
            )
            run_config = " ".join(
                (
                    f"num-server-rounds={args.rounds}",
                    f"min-nodes={nodes}",
                    f"gradstore-api={toml_string(api)}",
                    f"gradstore-coordinator-key={toml_string(str(coordinator))}",
                )
            )
            print(
                f"flower: SuperLink on 127.0.0.1:{link}, {nodes} SuperNodes, clients send "
                f"{args.send}{' (and a liar)' if args.liar else ''}; {args.rounds} rounds",
                flush=True,
            )
            rounds = _run(args, env, work, run_config)
            ok = rounds == args.rounds
            if not ok:
                print(f"error: {rounds} of {args.rounds} rounds reported", file=sys.stderr)
    finally:
        procs.stop()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"Flower's logs: {logs}", file=sys.stderr)
    return 0 if ok else 1


def _run(args: argparse.Namespace, env: dict[str, str], work: Path, run_config: str) -> int:
    """``flwr run --stream``: print our lines as they come; the number of round lines."""
    flwr_log = open(work / "logs" / "flwr-run.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            str(BIN / "flwr"),
            "run",
            str(args.app),
            "loopback",
            "--stream",
            "--run-config",
            run_config,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=work,
        text=True,
        start_new_session=True,
    )
    rounds = 0

    def too_long() -> None:
        print(f"error: the run took more than {args.timeout:.0f} s", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    watchdog = threading.Timer(args.timeout, too_long)
    watchdog.start()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            flwr_log.write(line)
            text = line.strip()
            if text.startswith(ROUND_MARK):
                rounds += 1
                print(text, flush=True)
            elif text.startswith(OTHER_MARKS):
                print(text, flush=True)
            if rounds >= args.rounds and text.startswith("gradstore run "):
                break  # the ServerApp is done; `flwr run --stream` may linger on the log stream
    finally:
        watchdog.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        flwr_log.close()
    return rounds


if __name__ == "__main__":
    sys.exit(main())
