"""Which Kubo to talk to, as the ``ipfs`` command decides: an address given, else the
environment, else the repo's ``api`` file that a running daemon writes."""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import NodeUnreachableError
from .rpc import api_url
from .settings import DEFAULT_API


def find_api(address: str | None = None) -> str:
    """The Kubo API URL: ``address``, else ``$GRADSTORE_API``, else the address in
    ``$IPFS_PATH/api`` (``~/.ipfs/api`` when ``IPFS_PATH`` is unset), else ``DEFAULT_API``.

    ``ValueError`` when ``address`` is no URL or multiaddr (the caller's mistake);
    ``NodeUnreachableError`` when the environment names a bad address, or when a set
    ``IPFS_PATH`` names no running daemon: never a silent fallback to another node.
    """
    if address:
        return api_url(address)
    env = os.environ.get("GRADSTORE_API")
    if env:
        return _named(env, "GRADSTORE_API")
    ipfs_path = os.environ.get("IPFS_PATH")
    repo = Path(ipfs_path).expanduser() if ipfs_path else Path.home() / ".ipfs"
    api_file = repo / "api"
    try:
        text = api_file.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        if ipfs_path:
            raise NodeUnreachableError(
                f"IPFS_PATH={ipfs_path} names no running Kubo daemon (it has no api file): "
                "start `ipfs daemon`, or name another API (--api URL, or GRADSTORE_API)"
            ) from None
        return DEFAULT_API
    except OSError as exc:
        raise NodeUnreachableError(f"cannot read {api_file}: {exc.strerror}") from exc
    if not text:
        raise NodeUnreachableError(f"{api_file} is empty: is the Kubo daemon still starting?")
    return _named(text, "$IPFS_PATH/api")


def _named(address: str, source: str) -> str:
    try:
        return api_url(address)
    except ValueError as exc:
        raise NodeUnreachableError(f"{exc} (from {source})") from exc
