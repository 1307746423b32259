"""``gradstore.node.connect``: an address, the environment or a directory becomes a Node, found
the way the ``ipfs`` command finds its daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gradstore.errors import NodeUnreachableError
from gradstore.node import KuboDaemon, KuboNode, LocalNode, connect
from gradstore.node.kubo import DEFAULT_API, find_api


@pytest.fixture(autouse=True)
def _no_node_in_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("GRADSTORE_API", "GRADSTORE_API_AUTH", "IPFS_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ipfs/api


def _repo(path: Path, api: str | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if api is not None:
        (path / "api").write_text(api + "\n")
    return path


def test_a_local_directory_is_the_embedded_node(tmp_path: Path) -> None:
    node = connect(local=tmp_path / "n")
    assert isinstance(node, LocalNode) and node.path == (tmp_path / "n").resolve()
    with pytest.raises(ValueError, match="not both"):
        connect("127.0.0.1:5001", local=tmp_path)


def test_the_address_then_gradstore_api_then_the_repo_api_file_then_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert find_api() == DEFAULT_API == "http://127.0.0.1:5001"
    home_repo = _repo(tmp_path / "home" / ".ipfs", "/ip4/127.0.0.1/tcp/4001")
    assert find_api() == "http://127.0.0.1:4001"  # ~/.ipfs/api when IPFS_PATH is unset
    monkeypatch.setenv("IPFS_PATH", str(_repo(tmp_path / "repo", "/ip4/127.0.0.1/tcp/4321")))
    assert find_api() == "http://127.0.0.1:4321"
    monkeypatch.setenv("GRADSTORE_API", "127.0.0.1:4555")
    assert find_api() == "http://127.0.0.1:4555"
    node = connect("/ip4/127.0.0.1/tcp/4777")
    assert isinstance(node, KuboNode) and node.api == "http://127.0.0.1:4777"
    assert home_repo.is_dir()


def test_an_ipfs_path_without_a_running_daemon_is_named_not_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repo = _repo(tmp_path / "repo", None)
    monkeypatch.setenv("IPFS_PATH", str(repo))
    with pytest.raises(NodeUnreachableError, match=f"IPFS_PATH={repo} names no running Kubo"):
        connect()
    (repo / "api").write_text("  \n")
    with pytest.raises(NodeUnreachableError, match="is empty: is the Kubo daemon still starting"):
        connect()


def test_a_bad_address_is_the_callers_mistake_a_bad_environment_names_its_source(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="not an http"):
        connect("ftp://127.0.0.1:5001")
    monkeypatch.setenv("IPFS_PATH", str(_repo(tmp_path / "repo", "/unix/tmp/api.sock")))
    with pytest.raises(NodeUnreachableError, match=r"\(from \$IPFS_PATH/api\)"):
        connect()
    monkeypatch.setenv("GRADSTORE_API", "ftp://x")
    with pytest.raises(NodeUnreachableError, match=r"\(from GRADSTORE_API\)"):
        connect()


def test_auth_comes_from_the_caller_else_gradstore_api_auth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert connect("127.0.0.1:5001").client.auth is None
    monkeypatch.setenv("GRADSTORE_API_AUTH", "Bearer env")
    assert connect("127.0.0.1:5001").client.auth == "Bearer env"
    assert connect("127.0.0.1:5001", auth="Bearer mine").client.auth == "Bearer mine"


def test_the_daemon_that_owns_ipfs_path_is_the_one_connected(
    kubo: KuboDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPFS_PATH", str(kubo.repo))
    if kubo.auth:
        monkeypatch.setenv("GRADSTORE_API_AUTH", kubo.auth)

    async def go() -> str:
        async with connect() as node:
            return (await node.identity()).peer_id

    assert asyncio.run(go()) == kubo.peer_id
