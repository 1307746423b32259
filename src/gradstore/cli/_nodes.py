"""Pick the node a command talks to: ``--local DIR``, else Kubo at ``--api`` / $GRADSTORE_API."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..node import Node

DEFAULT_API = "http://127.0.0.1:5001"


def add_node_options(
    parser: argparse.ArgumentParser, *, api_help: str = "Kubo RPC endpoint"
) -> None:
    """``--api``, ``--local`` and ``--api-auth``, in a "node" group."""
    group = parser.add_argument_group("node")
    group.add_argument(
        "--api",
        default=None,
        help=f"{api_help} (env GRADSTORE_API, default {DEFAULT_API})",
    )
    group.add_argument(
        "--local", metavar="DIR", default=None, help="use the embedded node stored in DIR"
    )
    group.add_argument(
        "--api-auth",
        default=None,
        help="Authorization header value for Kubo (env GRADSTORE_API_AUTH)",
    )


def node_from_args(args: argparse.Namespace) -> Node:
    """The node the options name (imported here: ``--help`` must not load the node layer)."""
    from ..node import KuboNode, LocalNode

    if args.local:
        return LocalNode(args.local)
    api = args.api or os.environ.get("GRADSTORE_API") or DEFAULT_API
    auth = args.api_auth or os.environ.get("GRADSTORE_API_AUTH")
    return KuboNode(api, auth=auth)
