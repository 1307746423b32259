"""The demo looks for Kubo where ``gradstore.node.connect`` does, $IPFS_PATH/api included."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gradstore.demo import open_demo_node
from gradstore.node import KuboDaemon


@pytest.fixture(autouse=True)
def _no_node_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GRADSTORE_API", "GRADSTORE_API_AUTH"):
        monkeypatch.delenv(name, raising=False)


def test_the_demo_uses_the_daemon_that_owns_ipfs_path(
    kubo: KuboDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPFS_PATH", str(kubo.repo))

    async def go() -> tuple[str, str | None]:
        async with open_demo_node() as dn:
            return dn.description, dn.reach

    description, reach = asyncio.run(go())
    assert description.startswith("kubo 0.") and description.endswith(f"at {kubo.api_url}")
    assert reach == f"--api {kubo.api_url}"


def test_an_ipfs_path_without_a_daemon_is_why_the_demo_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("IPFS_PATH", str(tmp_path))
    monkeypatch.setenv("GRADSTORE_KUBO", "/nonexistent/ipfs")  # find_kubo_binary() -> None

    async def go() -> tuple[str, Path]:
        async with open_demo_node() as dn:
            return dn.description, dn.node.path

    description, path = asyncio.run(go())
    assert description.startswith(
        f"local node in {path} (IPFS_PATH={tmp_path} names no running Kubo daemon"
    )
    assert description.endswith(", and no Kubo is installed; run scripts/install-kubo.sh)")
