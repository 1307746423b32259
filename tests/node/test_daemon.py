"""Finding a Kubo binary and launching isolated daemons."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gradstore.errors import NodeError
from gradstore.node import KuboDaemon, find_kubo_binary
from gradstore.node.kubo.daemon import auth_header, parse_version


def fake_ipfs(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_kubo_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An environment with no Kubo anywhere: empty PATH, empty cache."""
    monkeypatch.delenv("GRADSTORE_KUBO", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("GRADSTORE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_parse_version() -> None:
    assert parse_version("v0.42.0") == (0, 42, 0)
    assert parse_version("ipfs version 0.9.1\n") == (0, 9, 1)
    assert parse_version("latest") is None


def test_nothing_found_is_none(no_kubo_env: Path) -> None:
    assert find_kubo_binary() is None


def test_explicit_binary_wins_and_a_wrong_one_is_not_replaced(
    no_kubo_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit = fake_ipfs(no_kubo_env / "mine" / "ipfs", "0.1.0")
    fake_ipfs(no_kubo_env / "cache" / "kubo" / "v0.42.0" / "ipfs", "0.42.0")
    monkeypatch.setenv("GRADSTORE_KUBO", str(explicit))
    assert find_kubo_binary() == explicit
    monkeypatch.setenv("GRADSTORE_KUBO", str(no_kubo_env / "missing"))
    assert find_kubo_binary() is None


def test_path_binary_needs_version_0_40(no_kubo_env: Path) -> None:
    on_path = fake_ipfs(no_kubo_env / "bin" / "ipfs", "0.39.0")
    cached = fake_ipfs(no_kubo_env / "cache" / "kubo" / "v0.41.0" / "ipfs", "0.41.0")
    assert find_kubo_binary() == cached
    fake_ipfs(on_path, "0.42.0")
    assert find_kubo_binary() == on_path


def test_newest_cached_version_is_chosen(
    no_kubo_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = no_kubo_env / "xdg" / "gradstore" / "kubo"
    monkeypatch.delenv("GRADSTORE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(no_kubo_env / "xdg"))
    for version in ("v0.9.0", "v0.42.0", "v0.40.1"):
        fake_ipfs(cache / version / "ipfs", version)
    (cache / "v0.99.0").mkdir()  # an unfinished build: no binary
    assert find_kubo_binary() == cache / "v0.42.0" / "ipfs"


def test_auth_header_from_api_authorizations() -> None:
    assert auth_header(None) is None
    assert auth_header({"a": {"AuthSecret": "bearer:tok"}}) == "Bearer tok"
    assert auth_header({"a": {"AuthSecret": "basic:u:p"}}) == "Basic dTpw"


def test_daemon_start_stop_and_cli(kubo_binary: Path) -> None:
    daemon = KuboDaemon(kubo_binary)
    repo = daemon.repo
    with daemon:
        assert daemon.running
        assert daemon.api_url.startswith("http://127.0.0.1:")
        assert daemon.peer_id.startswith("12D3Koo")
        out = daemon.run("id", "-f", "<id>")
        assert out.stdout.decode().strip() == daemon.peer_id
        config = daemon.run("config", "Routing.Type").stdout.decode().strip()
        assert config == "none"
        assert daemon.run("config", "Pubsub.Enabled").stdout.decode().strip() == "true"
        pid = daemon._proc.pid  # type: ignore[union-attr]
    assert not daemon.running
    assert not repo.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    daemon.stop()  # idempotent


def test_a_daemon_that_cannot_start_reports_its_log(kubo_binary: Path, tmp_path: Path) -> None:
    daemon = KuboDaemon(
        kubo_binary, tmp_path / "repo", config={"Addresses.API": "/not/a/multiaddr"}
    )
    with pytest.raises(NodeError, match=r"(?s)exited with code.*multiaddr"):
        daemon.start()
    assert not daemon.running


def test_missing_binary_is_a_clear_error(no_kubo_env: Path) -> None:
    with pytest.raises(NodeError, match=r"install-kubo\.sh"):
        KuboDaemon()
