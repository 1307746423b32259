"""The node options of a command, and the node they name (``gradstore.node.connect``).

``--local DIR`` is the embedded node; otherwise Kubo at ``--api``, else ``$GRADSTORE_API``,
else the address in ``$IPFS_PATH/api`` (``~/.ipfs/api`` when ``IPFS_PATH`` is unset; a
running daemon writes it), else ``http://127.0.0.1:5001``. An ``IPFS_PATH`` that is set
but names no running daemon is an error, not a silent fallback to another node.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ._argtypes import seconds
from ._exit import UsageError

if TYPE_CHECKING:
    from ..job import JobConfig
    from ..node import Node

DEFAULT_API = "http://127.0.0.1:5001"  # for the help text: the node layer is not loaded yet
DEFAULT_TIMEOUT_S = 60.0
"""Seconds a node command waits without progress before it gives up (``--timeout``)."""
_NO_LIMIT_S = 10.0**7  # an HTTP read timeout that never fires first: --timeout decides


def add_node_options(
    parser: argparse.ArgumentParser, *, api_help: str = "Kubo RPC endpoint"
) -> None:
    """``--api``, ``--local`` and ``--api-auth``, in a "node" group."""
    group = parser.add_argument_group("node")
    group.add_argument(
        "--api",
        default=None,
        help=f"{api_help} (env GRADSTORE_API, else $IPFS_PATH/api, else {DEFAULT_API})",
    )
    group.add_argument(
        "--local", metavar="DIR", default=None, help="use the embedded node stored in DIR"
    )
    group.add_argument(
        "--api-auth",
        default=None,
        help="Authorization header value for Kubo (env GRADSTORE_API_AUTH)",
    )


def add_timeout_option(parser: argparse.ArgumentParser) -> None:
    """``--timeout S``: give up after S seconds without progress (0: never)."""
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"give up after S seconds in which nothing arrives (default {DEFAULT_TIMEOUT_S:g}; "
        "0 waits for ever); a line on stderr says what is awaited after a few seconds",
    )


def node_from_args(args: argparse.Namespace, *, wait_s: float | None = None) -> Node:
    """The node the options name, through ``gradstore.node.connect`` (imported here: ``--help``
    must not load the node layer).

    ``wait_s``, when given, is how long the command itself waits for a stalled answer
    (``--timeout``; 0 for ever): Kubo's HTTP read timeout is then set beyond it, so the
    command's own message, which names the CID and the option, is what the user sees.
    """
    from ..node import Timeouts, connect

    local: str | None = args.local
    if local:
        return connect(local=local)
    api: str | None = args.api
    auth: str | None = args.api_auth
    timeouts = Timeouts()
    if wait_s is not None:
        timeouts = Timeouts(read=max(timeouts.read, wait_s + 30.0) if wait_s else _NO_LIMIT_S)
    try:
        return connect(api, auth=auth, timeouts=timeouts)
    except ValueError as exc:  # --api's own address; the environment's name their source
        raise UsageError(f"--api: {exc}") from exc


def pinned_through(node: Node, config: JobConfig) -> Node:
    """``node``, or with the job's ``[pinning]`` the same Kubo with its pins kept by IPFS
    Cluster at the job's replication factors."""
    if config.pinning is None:
        return node
    from ..node.cluster import Replication, with_cluster

    p = config.pinning
    return with_cluster(
        node, p.cluster, Replication(p.replication_min, p.replication_max, p.wait_s)
    )
