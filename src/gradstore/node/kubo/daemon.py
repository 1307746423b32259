"""Find a Kubo binary and launch isolated Kubo daemons (tests, demos, local runs).

A launched daemon has its own ``IPFS_PATH``, the ``test`` and ``unixfs-v1-2025``
profiles (loopback only, random ports, no bootstrap), pubsub on, no routing
and no GC; the actual API address is read from ``$IPFS_PATH/api``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Self

import httpx

from ...errors import NodeError
from .._child import ChildProcess
from .node import KuboNode
from .rpc import api_url
from .settings import DEFAULT_DAEMON_SETTINGS, DaemonSettings

MIN_KUBO_VERSION: Final = (0, 40)
"""Oldest Kubo taken from ``PATH`` (the ``unixfs-v1-2025`` profile needs a recent Kubo)."""

PROFILES: Final = "test,unixfs-v1-2025"
DAEMON_CONFIG: Final[Mapping[str, Any]] = {
    "Pubsub.Enabled": True,
    "Routing.Type": "none",
}
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def kubo_cache_dir() -> Path:
    """Where ``scripts/install-kubo.sh`` builds Kubo.

    ``${GRADSTORE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gradstore}/kubo``.
    """
    root = os.environ.get("GRADSTORE_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "gradstore")
    return Path(root) / "kubo"


def parse_version(text: str) -> tuple[int, ...] | None:
    """``"v0.42.0"`` or ``"ipfs version 0.42.0"`` -> ``(0, 42, 0)``; ``None`` if there is none."""
    m = _VERSION.search(text)
    if not m:
        return None
    return tuple(int(part) for part in m.groups() if part is not None)


def kubo_version(binary: Path) -> tuple[int, ...] | None:
    """The version ``binary version --number`` reports, or ``None`` if it does not run."""
    try:
        out = subprocess.run(
            [str(binary), "version", "--number"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_version(out.stdout)


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_kubo_binary() -> Path | None:
    """Kubo to use: ``$GRADSTORE_KUBO``, else ``ipfs`` on PATH if >= 0.40, else the newest cached.

    An explicit ``$GRADSTORE_KUBO`` that is not an executable file gives ``None``
    (no silent fallback to another Kubo).
    """
    explicit = os.environ.get("GRADSTORE_KUBO")
    if explicit:
        path = Path(explicit).expanduser()
        return path if _executable(path) else None
    on_path = shutil.which("ipfs")
    if on_path:
        version = kubo_version(Path(on_path))
        if version is not None and version[:2] >= MIN_KUBO_VERSION:
            return Path(on_path)
    cached: list[tuple[tuple[int, ...], Path]] = []
    cache = kubo_cache_dir()
    if cache.is_dir():
        for entry in cache.iterdir():
            version = parse_version(entry.name)
            if version is not None and _executable(entry / "ipfs"):
                cached.append((version, entry / "ipfs"))
    return max(cached)[1] if cached else None


def auth_header(authorizations: object) -> str | None:
    """The ``Authorization`` header for the first of Kubo's ``API.Authorizations`` entries.

    ``AuthSecret`` is ``bearer:<token>`` or ``basic:<user>:<password>`` (or a bare token).
    """
    if not isinstance(authorizations, Mapping) or not authorizations:
        return None
    entry = next(iter(authorizations.values()))
    secret = str(entry.get("AuthSecret", "")) if isinstance(entry, Mapping) else ""
    if secret.startswith("basic:"):
        return "Basic " + base64.b64encode(secret[len("basic:") :].encode()).decode("ascii")
    return "Bearer " + secret.removeprefix("bearer:")


def _set_config(config: dict[str, Any], dotted: str, value: Any) -> None:
    node = config
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


class KuboDaemon(ChildProcess):
    """An isolated Kubo daemon on loopback: ``with KuboDaemon() as d: KuboNode(d.api_url)``.

    ``repo`` defaults to a fresh temporary directory, removed by ``stop()``.
    ``config`` adds dotted config keys (``{"API.Authorizations": {...}}``) to the defaults.
    The daemon's output goes to ``<repo>/daemon.log``.
    """

    def __init__(
        self,
        binary: Path | str | None = None,
        repo: Path | str | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        settings: DaemonSettings = DEFAULT_DAEMON_SETTINGS,
        daemon_args: Sequence[str] = (),
    ) -> None:
        found = Path(binary) if binary is not None else find_kubo_binary()
        if found is None:
            raise NodeError(
                "no Kubo binary found: set GRADSTORE_KUBO, put ipfs >= 0.40 on PATH, "
                "or run scripts/install-kubo.sh"
            )
        self.binary = found
        self._owns_repo = repo is None
        self.repo = (
            Path(repo) if repo is not None else Path(tempfile.mkdtemp(prefix="gradstore-kubo-"))
        )
        self.config = {**DAEMON_CONFIG, **(config or {})}
        self.settings = settings
        self.daemon_args = tuple(daemon_args)
        self.auth = auth_header(self.config.get("API.Authorizations"))
        self.api_url = ""
        self.peer_id = ""
        self.swarm_addrs: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def __repr__(self) -> str:
        state = self.api_url or "stopped"
        return f"KuboDaemon({str(self.repo)!r}, {state})"

    @property
    def log_path(self) -> Path:
        return self.repo / "daemon.log"

    @property
    def pid(self) -> int | None:
        """The daemon's process id (None: not started), e.g. to measure its CPU."""
        return None if self._proc is None else self._proc.pid

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["IPFS_PATH"] = str(self.repo)
        env["IPFS_TELEMETRY"] = "off"
        env.pop("IPFS_API", None)
        return env

    def run(
        self, *args: str, check: bool = True, input: bytes | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[bytes]:
        """Run the ``ipfs`` CLI on this repo (and daemon, if running): ``run("add", "-n", f)``."""
        return subprocess.run(
            [str(self.binary), *args],
            env=self._env(),
            input=input,
            capture_output=True,
            check=check,
            timeout=timeout,
        )

    def init(self) -> None:
        """``ipfs init`` with the profiles (once), then write the daemon config keys."""
        config_path = self.repo / "config"
        if not config_path.exists():
            self.repo.mkdir(parents=True, exist_ok=True)
            result = self.run("init", f"--profile={PROFILES}", check=False)
            if result.returncode != 0:
                raise NodeError(
                    f"ipfs init failed in {self.repo}: "
                    f"{result.stderr.decode(errors='replace').strip()}"
                )
        config = json.loads(config_path.read_text())
        for key, value in self.config.items():
            _set_config(config, key, value)
        tmp = config_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config, indent=2))
        tmp.replace(config_path)

    def start(self) -> Self:
        """Init if needed, launch ``ipfs daemon`` and wait until its API answers."""
        if self.running:
            return self
        self.init()
        api_file = self.repo / "api"
        api_file.unlink(missing_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(
            [str(self.binary), "daemon", "--enable-gc=false", *self.daemon_args],
            env=self._env(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_ready(api_file)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, api_file: Path) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.settings.start_timeout
        while True:
            if self._proc.poll() is not None:
                raise NodeError(
                    f"Kubo daemon exited with code {self._proc.returncode} during startup "
                    f"({self.repo}):\n{self._tail()}"
                )
            if api_file.exists():
                address = api_file.read_text().strip()
                if address:
                    url = api_url(address)
                    headers = {"Authorization": self.auth} if self.auth else {}
                    try:
                        response = httpx.post(f"{url}/api/v0/id", headers=headers, timeout=2.0)
                    except httpx.HTTPError:
                        response = None
                    if response is not None and response.status_code == 200:
                        ident = response.json()
                        self.api_url = url
                        self.peer_id = str(ident["ID"])
                        self.swarm_addrs = [str(a) for a in ident.get("Addresses") or []]
                        return
            if time.monotonic() >= deadline:
                raise NodeError(
                    f"Kubo daemon did not answer within {self.settings.start_timeout}s "
                    f"({self.repo}):\n{self._tail()}"
                )
            time.sleep(self.settings.poll_interval)

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; remove a temporary repo."""
        grace = self.settings.stop_grace if grace is None else grace
        self._end(grace)
        self.api_url = ""
        if self._owns_repo:
            shutil.rmtree(self.repo, ignore_errors=True)

    def node(self, **kwargs: Any) -> KuboNode:
        """A ``KuboNode`` for this daemon's API (create it inside the event loop that uses it)."""
        if not self.api_url:
            raise NodeError(f"{self!r} is not running")
        kwargs.setdefault("auth", self.auth)
        return KuboNode(self.api_url, **kwargs)

    def loopback_addr(self) -> str:
        """This daemon's loopback TCP swarm address with ``/p2p/<id>``, for ``swarm_connect``."""
        for addr in self.swarm_addrs:
            if addr.startswith("/ip4/127.0.0.1/tcp/"):
                return addr if "/p2p/" in addr else f"{addr}/p2p/{self.peer_id}"
        raise NodeError(f"{self!r} has no loopback swarm address: {self.swarm_addrs}")

    def close(self) -> None:
        """``stop()``: what leaving ``with KuboDaemon(...) as d:`` does."""
        self.stop()

    def __enter__(self) -> Self:
        return self.start()


def stop_all(daemons: Iterable[KuboDaemon], grace: float | None = None) -> None:
    """Stop several daemons: signal them all first, then wait for each (shutdowns overlap)."""
    daemons = list(daemons)
    for daemon in daemons:
        daemon.terminate()
    for daemon in daemons:
        daemon.stop(grace)
