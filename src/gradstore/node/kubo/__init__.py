"""Kubo, one backend of the ``Node`` interface: its RPC client and the daemon launcher.

``node`` holds ``KuboNode`` (the ``Node`` calls and Kubo's own), ``rpc`` builds requests and
parses answers without I/O, ``bulk`` reads large answers on a blocking socket,
``guarded_import`` pins a new DAG without Kubo's walk, ``daemon`` launches isolated daemons,
and ``settings`` holds the timeouts and defaults.
"""

from .daemon import KuboDaemon, find_kubo_binary, stop_all
from .node import KuboNode, KuboSubscription
from .settings import DEFAULT_API, DaemonSettings, Timeouts

__all__ = [
    "DEFAULT_API",
    "DaemonSettings",
    "KuboDaemon",
    "KuboNode",
    "KuboSubscription",
    "Timeouts",
    "find_kubo_binary",
    "stop_all",
]
