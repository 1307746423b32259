"""Pick the node the demo runs on: a Kubo that answers, else a Kubo we start, else LocalNode."""

from __future__ import annotations

import asyncio
import shlex
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import NodeUnreachableError
from ..node import KuboDaemon, Node, answering_version, connect, find_kubo_binary
from ..node.kubo import find_api


@dataclass(frozen=True)
class DemoNode:
    """The node in use, the line that describes it, and how to reach it after the demo.

    ``reach`` is the node option of a later command (``--api URL``, ``--local DIR``,
    shell-quoted) when the node outlives the demo; otherwise ``gone`` says what removes it.
    """

    node: Node
    description: str
    reach: str | None = None
    gone: str = ""


@asynccontextmanager
async def open_demo_node(
    api: str | None = None, local: str | Path | None = None, auth: str | None = None
) -> AsyncIterator[DemoNode]:
    """``--local DIR``; else the Kubo at ``api`` (else where ``connect`` finds one) if it answers;
    else start the installed Kubo (own temporary repo, stopped on exit); else a LocalNode in a
    temporary dir."""
    if local is not None:
        node = connect(local=local)
        try:
            yield DemoNode(node, f"local node in {node.path}", _option("--local", node.path))
        finally:
            await node.aclose()
        return
    try:
        url: str | None = find_api(api)
    except NodeUnreachableError as exc:  # an IPFS_PATH with no running daemon, say
        url, why, why_local = None, str(exc), f"{exc}, and no Kubo is installed"
    else:
        why = f"nothing answered at {url}"
        why_local = f"no Kubo answered at {url} and none is installed"
    version = None if url is None else await answering_version(url, auth)
    if url is not None and version is not None:
        kubo = connect(url, auth=auth)
        try:
            yield DemoNode(kubo, f"kubo {version} at {kubo.api}", _option("--api", kubo.api))
        finally:
            await kubo.aclose()
        return
    binary = find_kubo_binary()
    if binary is not None:
        daemon = KuboDaemon(binary)
        await asyncio.to_thread(daemon.start)
        try:
            kubo = daemon.node()
            try:
                version = await kubo.version()
                yield DemoNode(
                    kubo,
                    f"kubo {version} at {kubo.api} (started by the demo; {why})",
                    gone="the Kubo the demo started is stopped and its repo deleted",
                )
            finally:
                await kubo.aclose()
        finally:
            await asyncio.to_thread(daemon.stop)
        return
    with tempfile.TemporaryDirectory(prefix="gradstore-demo-") as tmp:
        node = connect(local=tmp)
        try:
            yield DemoNode(
                node,
                f"local node in {node.path} ({why_local}; run scripts/install-kubo.sh)",
                gone="the demo's temporary local node is deleted",
            )
        finally:
            await node.aclose()


def _option(name: str, value: object) -> str:
    """``--local '/a dir'``: an option as a shell takes it back."""
    return f"{name} {shlex.quote(str(value))}"
