#!/usr/bin/env python3
"""Run the Flower example end to end on loopback, with Flower's own processes.

Starts a Flower SuperLink and two SuperNodes (``flower-superlink``, ``flower-supernode``),
uses the Kubo ``gradstore.node.connect`` finds (``--api``, else $GRADSTORE_API, else
$IPFS_PATH/api, else 127.0.0.1:5001) when one answers there (else starts one from
``scripts/install-kubo.sh``'s build, with its own temporary repo), submits this directory's
Flower App with ``flwr run``, and prints one line per round ending with that round's
record CID (``scripts/verify_round.py CID`` re-derives it). Flower's own logs go to files
in a temporary directory, kept (and named) when something fails.

    python examples/flower/run.py [--rounds 3] [--send cid|arrays]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gradstore.errors import NodeError
from gradstore.messages import SigningKey
from gradstore.node import RunningKubo, running_kubo


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


# The App imports Flower and scikit-learn, and Flower brings flower-superlink and the rest.
_MISSING = [n for m, n in (("flwr", "Flower"), ("sklearn", "scikit-learn")) if not _installed(m)]
if _MISSING:
    raise SystemExit(
        f"error: this example needs {' and '.join(_MISSING)}: install the optional extras "
        "'flower' and 'demo' (pip install 'gradstore[flower,demo]')"
    )

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode and flwr live here
ROUND_MARK = "gradstore round "
DONE_MARK = "gradstore run "
OTHER_MARKS = ("gradstore refused", DONE_MARK)


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


@contextlib.contextmanager
def kubo(api: str | None) -> Iterator[RunningKubo]:
    """The Kubo ``gradstore.node.running_kubo`` finds or starts, or exit with why not."""
    with contextlib.ExitStack() as stack:
        try:
            found = stack.enter_context(running_kubo(api))
        except ValueError as exc:  # --api names no URL or multiaddr
            raise SystemExit(f"error: --api: {exc}") from None
        except NodeError as exc:  # nothing answers and none installed; no pubsub
            raise SystemExit(f"error: {exc}") from None
        print(f"node: {found.description}", flush=True)
        yield found


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


class Federation:
    """A SuperLink and SuperNodes on loopback, with a Flower config naming the SuperLink.

    ``work`` holds the Flower home, the keys and ``logs/``. ``node_configs`` are the
    SuperNodes' ``--node-config`` strings; use as a context manager (stops everything).
    """

    def __init__(self, work: Path, node_configs: list[str]) -> None:
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ)
        self.env.update(
            FLWR_HOME=str(work / "flwr"),
            FLWR_TELEMETRY_ENABLED="0",  # loopback only
            PATH=f"{BIN}{os.pathsep}{self.env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
        )
        self.node_configs = node_configs
        self.procs = Processes(self.logs, self.env)
        self.port = 0

    def __enter__(self) -> Federation:
        try:
            self.port = free_port()
            superlink = self.procs.start(
                "superlink",
                "flower-superlink",
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            )
            wait_for_port(self.port, superlink, "flower-superlink", 60)
            for i, node_config in enumerate(self.node_configs):
                self.procs.start(
                    f"supernode{i}",
                    "flower-supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    node_config,
                )
            (self.work / "flwr").mkdir(exist_ok=True)
            (self.work / "flwr" / "config.toml").write_text(
                '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
            )
        except BaseException:
            self.procs.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.procs.stop()

    def run(
        self, app: Path, run_config: str, timeout: float, until: Callable[[str], bool]
    ) -> Iterator[str]:
        """``flwr run APP --stream``: yield its output lines until ``until(line)`` is true."""
        log = open(self.logs / "flwr-run.log", "w")  # noqa: SIM115  (closed below)
        proc = subprocess.Popen(
            [
                str(BIN / "flwr"),
                "run",
                str(app),
                "loopback",
                "--stream",
                "--run-config",
                run_config,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.work,
            text=True,
            start_new_session=True,
        )

        def too_long() -> None:
            print(f"error: the run took more than {timeout:.0f} s", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)

        watchdog = threading.Timer(timeout, too_long)
        watchdog.start()
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                text = line.strip()
                yield text
                if until(text):
                    break  # the ServerApp is done; `flwr run --stream` may linger on the logs
        finally:
            watchdog.cancel()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument(
        "--send", choices=("cid", "arrays"), default="cid", help="what clients reply with"
    )
    parser.add_argument(
        "--model-via",
        choices=("ipfs", "flower"),
        default="ipfs",
        help="how the global model reaches the clients (by CID, or in Flower's message)",
    )
    parser.add_argument(
        "--liar",
        action="store_true",
        help="add a SuperNode whose client signs one CID and sends other arrays (it is refused)",
    )
    parser.add_argument(
        "--api",
        help="Kubo RPC URL (default: $GRADSTORE_API, else $IPFS_PATH/api, else 127.0.0.1:5001)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="gradstore-flower-"))
    ok = False
    try:
        with kubo(args.api) as found:
            api = found.api
            coordinator = work / "coordinator.pem"
            SigningKey.generate().save(coordinator)
            nodes = args.clients + (1 if args.liar else 0)
            configs = []
            for i in range(nodes):
                key = work / f"client{i}.pem"
                SigningKey.generate().save(key)
                liar = i == args.clients
                configs.append(
                    " ".join(
                        (
                            f"partition-id={i % args.clients}",
                            f"num-partitions={args.clients}",
                            f"gradstore-key={toml_string(str(key))}",
                            f"gradstore-api={toml_string(api)}",
                            f"gradstore-send={toml_string('arrays' if liar else args.send)}",
                            *(["gradstore-lie=true"] if liar else []),
                        )
                    )
                )
            run_config = " ".join(
                (
                    f"num-server-rounds={args.rounds}",
                    f"min-nodes={nodes}",
                    f"gradstore-model={toml_string(args.model_via)}",
                    f"gradstore-api={toml_string(api)}",
                    f"gradstore-coordinator-key={toml_string(str(coordinator))}",
                )
            )
            with Federation(work, configs) as federation:
                print(
                    f"flower: SuperLink on 127.0.0.1:{federation.port}, {nodes} SuperNodes, "
                    f"model via {args.model_via}, clients send {args.send}"
                    f"{' (and a liar)' if args.liar else ''}; {args.rounds} rounds",
                    flush=True,
                )
                rounds = 0
                for text in federation.run(
                    HERE, run_config, args.timeout, lambda line: line.startswith(DONE_MARK)
                ):
                    if text.startswith(ROUND_MARK):
                        rounds += 1
                    if text.startswith((ROUND_MARK, *OTHER_MARKS)):
                        print(text, flush=True)
            ok = rounds == args.rounds
            if not ok:
                print(f"error: {rounds} of {args.rounds} rounds reported", file=sys.stderr)
    finally:
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"Flower's logs: {work / 'logs'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
