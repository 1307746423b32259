"""Shared fixtures: real, isolated Kubo daemons on loopback, and an embedded LocalNode.

Tests are plain functions that call ``asyncio.run(...)`` on an inner coroutine
(no pytest-asyncio). Create ``KuboNode`` objects inside that coroutine
(``daemon.node()``): an httpx client belongs to the event loop that uses it.

Any test using ``kubo_binary``, ``kubo`` or ``kubo_factory`` gets the ``kubo``
marker. Without a Kubo binary those tests skip, except under CI (``CI`` set and
not ``false``/``0``), where they fail: CI must run them. The same goes for
``cluster_bin_dir`` and ``kubo_cluster`` (3 Kubo daemons, each with its IPFS Cluster peer)
and the ``cluster`` marker, with the build of ``scripts/install-cluster.sh``
(``GRADSTORE_CLUSTER_BIN_DIR``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gradstore.node import KuboDaemon, LocalNode, find_kubo_binary, stop_all
from gradstore.node.cluster import ClusterPeer, find_cluster_bin_dir, new_secret, stop_peers
from gradstore.node.cluster.daemon import wait_for_peer_set

KUBO_FIXTURES = frozenset({"kubo_binary", "kubo", "kubo_factory", "kubo_cluster"})
CLUSTER_FIXTURES = frozenset({"cluster_bin_dir", "kubo_cluster"})


def _in_ci() -> bool:
    value = os.environ.get("CI", "").strip().lower()
    return value not in ("", "false", "0")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if KUBO_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kubo)
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def kubo_binary() -> Path:
    """The Kubo binary (``find_kubo_binary``); skip, or fail under CI, when there is none."""
    binary = find_kubo_binary()
    if binary is None:
        message = (
            "no Kubo binary: run scripts/install-kubo.sh (builds Kubo into ~/.cache/gradstore), "
            "put ipfs >= 0.40 on PATH, or set GRADSTORE_KUBO=/path/to/ipfs"
        )
        if _in_ci():
            pytest.fail(message + " (CI is set: Kubo tests must run)")
        pytest.skip(message)
    return binary


@pytest.fixture(scope="session")
def kubo(kubo_binary: Path) -> Iterator[KuboDaemon]:
    """One isolated daemon shared by the whole session (tests must not depend on its state)."""
    daemon = KuboDaemon(kubo_binary).start()
    try:
        yield daemon
    finally:
        daemon.stop()


class KuboFactory:
    """``start(n, connect=False)`` -> n fresh daemons, all stopped at teardown."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self.daemons: list[KuboDaemon] = []

    def start(self, n: int = 1, *, connect: bool = False) -> list[KuboDaemon]:
        started = []
        for _ in range(n):
            daemon = KuboDaemon(self.binary)
            self.daemons.append(daemon)
            started.append(daemon.start())
        if connect:
            for i, daemon in enumerate(started):
                for other in started[i + 1 :]:
                    daemon.run("swarm", "connect", other.loopback_addr())
        return started

    __call__ = start

    def stop(self) -> None:
        stop_all(self.daemons)


@pytest.fixture
def kubo_factory(kubo_binary: Path) -> Iterator[Callable[..., list[KuboDaemon]]]:
    """Start fresh daemons for one test: ``a, b = kubo_factory(2, connect=True)``."""
    factory = KuboFactory(kubo_binary)
    try:
        yield factory
    finally:
        factory.stop()


@pytest.fixture(scope="session")
def cluster_bin_dir() -> Path:
    """The IPFS Cluster build's folder; skip, or fail under CI, when there is none."""
    folder = find_cluster_bin_dir()
    if folder is None:
        message = (
            "no IPFS Cluster build: run scripts/install-cluster.sh (builds it into "
            "~/.cache/gradstore), or set GRADSTORE_CLUSTER_BIN_DIR to the folder it printed"
        )
        if _in_ci():
            pytest.fail(message + " (CI is set: cluster tests must run)")
        pytest.skip(message)
    return folder


class KuboCluster:
    """3 Kubo daemons (connected), each with its cluster peer, every peer seeing the others."""

    def __init__(self, kubo: Path, bin_dir: Path, n: int = 3) -> None:
        self.secret = new_secret()
        self.kubos: list[KuboDaemon] = []
        self.peers: list[ClusterPeer] = []
        try:
            for i in range(n):
                daemon = KuboDaemon(kubo)
                self.kubos.append(daemon)
                daemon.start()
                for other in self.kubos[:i]:
                    daemon.run("swarm", "connect", other.loopback_addr())
                known = [p.cluster_addr for p in self.peers]  # every peer so far
                peer = ClusterPeer(bin_dir, daemon.api_url, self.secret, bootstrap=known)
                self.peers.append(peer)
                peer.start()
            wait_for_peer_set(self.peers)
        except BaseException:
            self.stop()
            raise

    def kill(self, i: int) -> None:
        """SIGKILL Kubo daemon ``i`` and its cluster peer (a lost machine)."""
        self.peers[i].kill()
        self.kubos[i].kill()

    def stop(self) -> None:
        stop_peers(self.peers)
        stop_all(self.kubos)


@pytest.fixture
def kubo_cluster(kubo_binary: Path, cluster_bin_dir: Path) -> Iterator[KuboCluster]:
    """A fresh 3-peer cluster on loopback for one test (CRDT consensus, a shared secret)."""
    cluster = KuboCluster(kubo_binary, cluster_bin_dir)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def local_node(tmp_path: Path) -> LocalNode:
    """An embedded node in a fresh directory."""
    return LocalNode(tmp_path / "node")
