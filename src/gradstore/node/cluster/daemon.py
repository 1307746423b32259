"""Find the IPFS Cluster build and launch isolated cluster peers beside Kubo daemons (tests).

A launched peer has its own config folder: CRDT consensus, the secret its cluster shares,
every address on 127.0.0.1 at a free port, mDNS off, no relay service, and ipfshttp pointing
at its Kubo's API. (v1.1.6 always asks the gateway for a NAT port mapping: its config has
no switch for it; with loopback listen addresses only, nothing is mapped.)
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Self

import httpx

from ...errors import NodeError
from .._child import ChildProcess

CLUSTER_VERSION: Final = "v1.1.6"
"""The version ``scripts/install-cluster.sh`` builds (it runs with Kubo v0.42.0)."""

SERVICE: Final = "ipfs-cluster-service"

#: Short metric lifetimes in tests: a dead peer stops being allocated to within seconds.
TEST_TIMINGS: Final[Mapping[str, str]] = {
    "informer.disk.metric_ttl": "2s",
    "informer.pinqueue.metric_ttl": "2s",
    "informer.tags.metric_ttl": "2s",
    "monitor.pubsubmon.check_interval": "1s",
    "cluster.monitor_ping_interval": "1s",
    "cluster.peer_watch_interval": "1s",
}


def cluster_cache_dir() -> Path:
    """Where ``scripts/install-cluster.sh`` builds IPFS Cluster:
    ``${GRADSTORE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gradstore}/ipfs-cluster``."""
    root = os.environ.get("GRADSTORE_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "gradstore")
    return Path(root) / "ipfs-cluster"


def find_cluster_bin_dir() -> Path | None:
    """The folder holding ``ipfs-cluster-service``: ``$GRADSTORE_CLUSTER_BIN_DIR`` (nothing
    else when set), else the cached build of ``CLUSTER_VERSION``; None when there is none."""
    explicit = os.environ.get("GRADSTORE_CLUSTER_BIN_DIR")
    folder = Path(explicit).expanduser() if explicit else cluster_cache_dir() / CLUSTER_VERSION
    service = folder / SERVICE
    return folder if service.is_file() and os.access(service, os.X_OK) else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_secret() -> str:
    """A cluster secret: 32 random bytes in hex, shared by every peer of one cluster."""
    return secrets.token_hex(32)


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    node = config
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _multiaddr_of(url: str) -> str:
    parsed = httpx.URL(url)
    return f"/ip4/{parsed.host}/tcp/{parsed.port}"


def loopback_settings(ipfs_api: str, secret: str) -> dict[str, Any]:
    """The dotted service.json keys a test peer sets: loopback addresses at free ports, the
    shared ``secret``, mDNS off, no relay service, ipfshttp at ``ipfs_api`` (a URL)."""
    return {
        "cluster.secret": secret,
        "cluster.listen_multiaddress": [f"/ip4/127.0.0.1/tcp/{free_port()}"],
        "cluster.enable_relay_hop": False,
        "cluster.mdns_interval": "0s",
        "api.restapi.http_listen_multiaddress": f"/ip4/127.0.0.1/tcp/{free_port()}",
        "api.ipfsproxy.listen_multiaddress": f"/ip4/127.0.0.1/tcp/{free_port()}",
        "api.ipfsproxy.node_multiaddress": _multiaddr_of(ipfs_api),
        "api.pinsvcapi.http_listen_multiaddress": f"/ip4/127.0.0.1/tcp/{free_port()}",
        "ipfs_connector.ipfshttp.node_multiaddress": _multiaddr_of(ipfs_api),
        "ipfs_connector.ipfshttp.connect_swarms_delay": "0s",
        **TEST_TIMINGS,
    }


_READY: Final = "IPFS Cluster is READY"  # what the service logs once it takes requests
_PORT_TAKEN: Final = "address already in use"  # what it logs when a listen port was taken

#: Launches of a peer whose listen ports another process took meanwhile (see ``start``).
PORT_ATTEMPTS: Final = 3


class ClusterPeer(ChildProcess):
    """One ``ipfs-cluster-service`` on loopback for a Kubo at ``ipfs_api``:
    ``ClusterPeer(bin_dir, kubo.api_url, secret).start()``; ``api_url`` is its REST API.

    ``bootstrap`` names peers to join (``/ip4/127.0.0.1/tcp/P/p2p/ID``); the folder defaults
    to a fresh temporary one, removed by ``stop()``. Output goes to ``<folder>/service.log``.
    """

    def __init__(
        self,
        bin_dir: Path | str,
        ipfs_api: str,
        secret: str,
        *,
        folder: Path | str | None = None,
        bootstrap: Sequence[str] = (),
        start_timeout: float = 60.0,
    ) -> None:
        self.binary = Path(bin_dir) / SERVICE
        self.ipfs_api = ipfs_api
        self.secret = secret
        self._owns_folder = folder is None
        self.folder = (
            Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="gradstore-cl-"))
        )
        self.bootstrap = tuple(bootstrap)
        self.start_timeout = start_timeout
        self.api_url = ""
        self.peer_id = ""
        self.cluster_addr = ""  # /ip4/127.0.0.1/tcp/P/p2p/ID, for another peer's bootstrap
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def __repr__(self) -> str:
        return f"ClusterPeer({str(self.folder)!r}, {self.api_url or 'stopped'})"

    @property
    def log_path(self) -> Path:
        return self.folder / "service.log"

    def init(self) -> None:
        """``ipfs-cluster-service init --consensus crdt`` (once), then the loopback settings."""
        config_path = self.folder / "service.json"
        if not config_path.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(
                [str(self.binary), "--config", str(self.folder), "init", "--consensus", "crdt"],
                capture_output=True,
                check=False,
                timeout=60,
            )
            if done.returncode != 0:
                raise NodeError(
                    f"ipfs-cluster-service init failed in {self.folder}: "
                    f"{done.stderr.decode(errors='replace').strip()}"
                )
            config = json.loads(config_path.read_text())
            for key, value in loopback_settings(self.ipfs_api, self.secret).items():
                _set(config, key, value)
            config_path.write_text(json.dumps(config, indent=2))
        config = json.loads(config_path.read_text())
        self.api_url = "http://" + _host_port(config["api"]["restapi"]["http_listen_multiaddress"])
        self.peer_id = json.loads((self.folder / "identity.json").read_text())["id"]
        listen = config["cluster"]["listen_multiaddress"][0]
        self.cluster_addr = f"{listen}/p2p/{self.peer_id}"

    def start(self) -> Self:
        """Init if needed, launch the service and wait until its REST API answers ``/id``.

        A port picked free at init can be taken by another process before the service binds
        it (a test run starts many daemons at once): the service then exits at startup
        with "address already in use", and it is started again on new free ports, up to
        ``PORT_ATTEMPTS`` times in all.
        """
        if self.running:
            return self
        self.init()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self._launch()
            try:
                self._wait_ready()
            except NodeError:
                taken = _PORT_TAKEN in self._log_text()
                self._end(0.0)
                if not taken or attempt == PORT_ATTEMPTS:
                    self.stop()
                    raise
                self._new_ports()
            except BaseException:
                self.stop()
                raise
            else:
                return self
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def _launch(self) -> None:
        args = [str(self.binary), "--config", str(self.folder), "daemon"]
        if self.bootstrap:
            args += ["--bootstrap", ",".join(self.bootstrap)]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _new_ports(self) -> None:
        """Give every listen address of the config a new free port (then read it again)."""
        config_path = self.folder / "service.json"
        config = json.loads(config_path.read_text())
        for key, value in loopback_settings(self.ipfs_api, self.secret).items():
            if key.endswith("listen_multiaddress"):
                _set(config, key, value)
        config_path.write_text(json.dumps(config, indent=2))
        self.init()

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._proc.poll() is not None:
                raise NodeError(
                    f"cluster peer exited with code {self._proc.returncode} during startup "
                    f"({self.folder}):\n{self._tail()}"
                )
            # A request that comes before the service says it is ready can crash v1.1.6 (a
            # nil RPC client: SIGSEGV at startup, seen when /id was polled at once): ask only
            # once the log says so.
            if _READY in self._log_text():
                try:
                    if httpx.get(f"{self.api_url}/id", timeout=2.0).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            if time.monotonic() >= deadline:
                raise NodeError(
                    f"cluster peer did not answer within {self.start_timeout}s "
                    f"({self.folder}):\n{self._tail()}"
                )
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; remove a temporary folder."""
        self._end(grace)
        if self._owns_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def close(self) -> None:
        """``stop()``: what leaving ``with ClusterPeer(...) as p:`` does."""
        self.stop()

    def __enter__(self) -> Self:
        return self.start()


def _host_port(multiaddr: str) -> str:
    parts = multiaddr.strip("/").split("/")  # ip4, 127.0.0.1, tcp, port
    return f"{parts[1]}:{parts[3]}"


def stop_peers(peers: Iterable[ClusterPeer]) -> None:
    """Stop several peers: signal them all first, then wait for each."""
    peers = list(peers)
    for peer in peers:
        peer.terminate()
    for peer in peers:
        peer.stop()


def wait_for_peer_set(peers: Sequence[ClusterPeer], timeout: float = 90.0) -> None:
    """Return once every running peer sees all of them (``GET /peers``) and has each one's
    free-space metric (what allocation needs): polled, never a fixed sleep."""
    want = {p.peer_id for p in peers if p.running}
    deadline = time.monotonic() + timeout
    missing: dict[str, set[str]] = {}
    while True:
        missing = {}
        for peer in peers:
            if peer.running:
                lacking = want - _seen(peer)
                if lacking:
                    missing[peer.peer_id] = lacking
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise NodeError(f"cluster peers still missing others after {timeout}s: {missing}")
        time.sleep(0.2)


def _seen(peer: ClusterPeer) -> set[str]:
    """The peers ``peer`` lists with no error and has a free-space metric of."""
    try:
        listed = httpx.get(f"{peer.api_url}/peers", timeout=5.0)
        metrics = httpx.get(f"{peer.api_url}/monitor/metrics/freespace", timeout=5.0)
    except httpx.HTTPError:
        return set()
    if listed.status_code != 200 or metrics.status_code != 200:
        return set()
    ok = set()
    for line in listed.text.splitlines():
        if line.strip():
            item = json.loads(line)
            if not item.get("error"):
                ok.add(str(item.get("id")))
    with_metric = {str(m.get("peer")) for m in metrics.json() or [] if m.get("valid", True)}
    return ok & with_metric
