"""IPFS nodes behind one narrow async interface: ``KuboNode`` (Kubo RPC) and ``LocalNode``.

``connect()`` makes the node an address, the environment or a directory names. Each backend
is one module or folder (``kubo/``, ``local.py``) behind ``base.Node``; optional
capabilities (``SupportsCatInto``, ``SupportsGuardedImport``) are protocols too: callers
test for them, not for a class. ``KuboDaemon`` and ``find_kubo_binary`` launch isolated
Kubo daemons for tests and local runs.
"""

from .._closing import Closing
from ._config import MAX_PUBSUB_DATA, Retry
from ._connect import connect
from ._follow import follow
from .base import Node, NodeIdentity, PubsubMessage, Subscription
from .capabilities import GuardedImport, SupportsCatInto, SupportsGuardedImport
from .kubo import (
    DaemonSettings,
    KuboDaemon,
    KuboNode,
    KuboSubscription,
    Timeouts,
    find_kubo_binary,
    stop_all,
)
from .local import LocalNode, LocalSubscription

__all__ = [
    "MAX_PUBSUB_DATA",
    "Closing",
    "DaemonSettings",
    "GuardedImport",
    "KuboDaemon",
    "KuboNode",
    "KuboSubscription",
    "LocalNode",
    "LocalSubscription",
    "Node",
    "NodeIdentity",
    "PubsubMessage",
    "Retry",
    "Subscription",
    "SupportsCatInto",
    "SupportsGuardedImport",
    "Timeouts",
    "connect",
    "find_kubo_binary",
    "follow",
    "stop_all",
]
