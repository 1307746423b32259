"""``connect``: the one place an address, the environment or a directory becomes a ``Node``.

The command line, ``TorchPeer``, Flower's bridge and the demo all connect here, so every
one of them finds Kubo the same way (``kubo.locate``) and a new backend is one more branch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import overload

from ._config import Retry
from .kubo.locate import find_api
from .kubo.node import KuboNode
from .kubo.settings import DEFAULT_TIMEOUTS, Timeouts
from .local import LocalNode


@overload
def connect(
    address: str | None = None,
    *,
    auth: str | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    retry: Retry | None = None,
) -> KuboNode: ...


@overload
def connect(*, local: str | Path) -> LocalNode: ...


@overload
def connect(
    address: str | None = None,
    *,
    local: str | Path | None,
    auth: str | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    retry: Retry | None = None,
) -> KuboNode | LocalNode: ...


def connect(
    address: str | None = None,
    *,
    local: str | Path | None = None,
    auth: str | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    retry: Retry | None = None,
) -> KuboNode | LocalNode:
    """The node to use: the embedded node stored in ``local``, else the Kubo ``find_api`` names.

    Kubo is at ``address`` (a URL, ``host:port`` or a multiaddr), else ``$GRADSTORE_API``,
    else ``$IPFS_PATH/api``'s address, else ``http://127.0.0.1:5001``; ``auth`` (else
    ``$GRADSTORE_API_AUTH``) is its ``Authorization`` header. Nothing is sent yet: make the
    node on the event loop that uses it. ``ValueError`` for a bad ``address``,
    ``NodeUnreachableError`` when the environment names no usable API.
    """
    if local is not None:
        if address is not None:
            raise ValueError("connect: give an address or a local directory, not both")
        return LocalNode(local)
    return KuboNode(
        find_api(address),
        auth=auth or os.environ.get("GRADSTORE_API_AUTH"),
        timeouts=timeouts,
        retry=retry,
    )
