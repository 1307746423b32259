"""Kubo, one backend of the ``Node`` interface: its RPC client and the daemon launcher.

``node`` holds ``KuboNode`` (the ``Node`` calls and Kubo's own), ``client`` sends
(``KuboClient``), ``subscription`` drains ``pubsub/sub`` through the client's ``stream``,
``rpc`` builds requests and parses answers without I/O, ``bulk`` reads large answers on a
blocking socket, ``guarded_import`` pins a new DAG without Kubo's walk, ``daemon`` launches
isolated daemons, ``locate`` finds the API to use (``find_api``), and ``settings`` holds the
timeouts and defaults.
"""

from .client import KuboClient
from .daemon import KuboDaemon, find_kubo_binary, stop_all
from .locate import find_api
from .node import KuboNode
from .settings import DEFAULT_API, DaemonSettings, Timeouts
from .subscription import KuboSubscription

__all__ = [
    "DEFAULT_API",
    "DaemonSettings",
    "KuboClient",
    "KuboDaemon",
    "KuboNode",
    "KuboSubscription",
    "Timeouts",
    "find_api",
    "find_kubo_binary",
    "stop_all",
]
