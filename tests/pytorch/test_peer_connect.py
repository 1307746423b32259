"""Without ``api``, a TorchPeer connects where ``gradstore.node.connect`` finds Kubo."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradstore.errors import NodeUnreachableError
from gradstore.job import parse_job
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon
from gradstore.torch import TorchPeer

KEY = SigningKey.from_seed(bytes([7]) * 32)
CONFIG = parse_job(
    {"job": "j", "coordinator": SigningKey.from_seed(bytes([9]) * 32).did, "peers": [KEY.did]}
)


@pytest.fixture(autouse=True)
def _no_node_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GRADSTORE_API", "GRADSTORE_API_AUTH"):
        monkeypatch.delenv(name, raising=False)


def test_the_peer_uses_the_daemon_that_owns_ipfs_path(
    kubo: KuboDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPFS_PATH", str(kubo.repo))
    with TorchPeer(CONFIG, KEY, timeout=10.0) as peer:
        assert peer._node is not None and peer._node.name == f"kubo {kubo.api_url}"


def test_an_ipfs_path_without_a_daemon_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("IPFS_PATH", str(tmp_path))
    with pytest.raises(NodeUnreachableError, match=f"IPFS_PATH={tmp_path} names no running Kubo"):
        TorchPeer(CONFIG, KEY).open()
