"""IPFS nodes behind one narrow async interface: ``KuboNode`` (Kubo RPC) and ``LocalNode``.

``connect()`` makes the node an address, the environment or a directory names. Each backend
is one module or folder (``kubo/``, ``local.py``) behind ``base.Node``; optional
capabilities (``SupportsCatInto``, ``SupportsGuardedImport``, ``SupportsSources``) are
protocols too: callers test for them, not for a class. ``find_sources`` says who could send a
node a CID it waits for (its peers, the providers its routing finds). ``KuboDaemon`` and ``find_kubo_binary`` launch isolated
Kubo daemons for tests and local runs; ``running_kubo`` is the user's Kubo if it answers, else
one started here (the examples' node).
"""

from .._closing import Closing
from ._config import MAX_PUBSUB_DATA, Retry
from ._connect import connect
from ._follow import follow
from ._running import RunningKubo, answering_version, running_kubo
from ._sources import Sources, find_sources
from .base import Node, NodeIdentity, PubsubMessage, Subscription
from .capabilities import GuardedImport, SupportsCatInto, SupportsGuardedImport, SupportsSources
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
    "RunningKubo",
    "Sources",
    "Subscription",
    "SupportsCatInto",
    "SupportsGuardedImport",
    "SupportsSources",
    "Timeouts",
    "answering_version",
    "connect",
    "find_kubo_binary",
    "find_sources",
    "follow",
    "running_kubo",
    "stop_all",
]
