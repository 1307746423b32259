"""``running_kubo``: the user's Kubo if it answers, else one started here (the examples' node)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from gradstore.errors import NodeError, NodeUnreachableError
from gradstore.node import KuboDaemon, answering_version, connect, running_kubo

pytestmark = pytest.mark.kubo


@pytest.fixture(autouse=True)
def _no_node_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GRADSTORE_API", "GRADSTORE_API_AUTH", "IPFS_PATH"):
        monkeypatch.delenv(name, raising=False)


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _answers(api: str) -> bool:
    async def go() -> bool:
        node = connect(api)
        try:
            await node.version()
            return True
        except NodeError:
            return False
        finally:
            await node.aclose()

    return asyncio.run(go())


def test_a_kubo_that_answers_is_used_and_left_running(kubo: KuboDaemon) -> None:
    with running_kubo(kubo.api_url) as found:
        assert (found.api, found.started) == (kubo.api_url, False)
        assert found.description.startswith("kubo 0.") and found.description.endswith(
            f"at {kubo.api_url}"
        )
    assert _answers(kubo.api_url)  # not ours to stop


def test_nothing_answering_starts_the_installed_kubo_and_stops_it(kubo_binary: Path) -> None:
    nobody = _closed_port()
    with running_kubo(nobody) as found:
        assert found.started and found.api != nobody
        assert f"(started here; nothing answered at {nobody})" in found.description
        assert _answers(found.api)
    assert not _answers(found.api)


def test_nothing_answering_and_none_installed_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GRADSTORE_KUBO", "/nonexistent/ipfs")  # find_kubo_binary() -> None
    nobody = _closed_port()
    with (
        pytest.raises(NodeUnreachableError, match=r"no Kubo is installed.*install-kubo\.sh"),
        running_kubo(nobody),
    ):
        pass


def test_a_kubo_without_pubsub_is_an_error_not_a_fallback(kubo_binary: Path) -> None:
    with KuboDaemon(kubo_binary, config={"Pubsub.Enabled": False}) as daemon:
        with pytest.raises(NodeError, match="pubsub disabled"):
            asyncio.run(answering_version(daemon.api_url))
        with pytest.raises(NodeError, match="pubsub disabled"), running_kubo(daemon.api_url):
            pass


def test_an_api_that_is_no_address_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="multiaddr"), running_kubo("/ip4/x"):
        pass
