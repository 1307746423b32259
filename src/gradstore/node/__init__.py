"""IPFS nodes behind one narrow async interface: ``KuboNode`` (Kubo RPC) and ``LocalNode``.

Optional capabilities (``SupportsCatInto``, ``SupportsGuardedImport``) are
protocols too: callers test for them, not for a class. ``KuboDaemon`` and
``find_kubo_binary`` launch isolated Kubo daemons for tests and local runs.
"""

from .._closing import Closing
from ._config import MAX_PUBSUB_DATA, DaemonSettings, Retry, Timeouts
from ._follow import follow
from .base import Node, NodeIdentity, PubsubMessage, Subscription
from .capabilities import GuardedImport, SupportsCatInto, SupportsGuardedImport
from .daemon import KuboDaemon, find_kubo_binary, stop_all
from .kubo import KuboNode, KuboSubscription
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
    "find_kubo_binary",
    "follow",
    "stop_all",
]
