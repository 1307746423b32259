"""IPFS nodes behind one narrow async interface: ``KuboNode`` (Kubo RPC) and ``LocalNode``.

``KuboDaemon`` and ``find_kubo_binary`` launch isolated Kubo daemons for tests
and local runs.
"""

from ._config import MAX_PUBSUB_DATA, DaemonSettings, Retry, Timeouts
from ._follow import follow
from .base import Node, NodeIdentity, PubsubMessage, Subscription
from .daemon import KuboDaemon, find_kubo_binary, stop_all
from .kubo import KuboNode, KuboSubscription
from .local import LocalNode, LocalSubscription

__all__ = [
    "MAX_PUBSUB_DATA",
    "DaemonSettings",
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
    "Timeouts",
    "find_kubo_binary",
    "follow",
    "stop_all",
]
