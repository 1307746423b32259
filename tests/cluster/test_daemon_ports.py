"""A cluster peer whose listen port another process took after it was picked starts anyway,
on new ports (a test run starts many daemons at once: a full suite lost a round test to
"bind: address already in use" on the IPFS proxy's port)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx

from gradstore.node.cluster import ClusterPeer, new_secret
from gradstore.node.kubo import KuboDaemon


def _port(multiaddr: str) -> int:
    return int(multiaddr.strip("/").split("/")[3])


def test_a_peer_whose_proxy_port_was_taken_starts_on_new_ports(
    cluster_bin_dir: Path, kubo: KuboDaemon, tmp_path: Path
) -> None:
    peer = ClusterPeer(cluster_bin_dir, kubo.api_url, new_secret(), folder=tmp_path / "peer")
    peer.init()
    config = json.loads((peer.folder / "service.json").read_text())
    taken = _port(config["api"]["ipfsproxy"]["listen_multiaddress"])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            peer.start()
            assert httpx.get(f"{peer.api_url}/id", timeout=5).status_code == 200
            config = json.loads((peer.folder / "service.json").read_text())
            assert _port(config["api"]["ipfsproxy"]["listen_multiaddress"]) != taken
        finally:
            peer.stop()
