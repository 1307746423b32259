"""IPFS Cluster as the pinning backend beside Kubo: ``ClusterNode`` pins through the
cluster's REST API (``rest.ClusterClient``) at a replication factor (``pins.ClusterPins``),
``status`` reads pin statuses without I/O, ``daemon`` launches cluster peers for tests."""

from .daemon import ClusterPeer, find_cluster_bin_dir, new_secret, stop_peers
from .node import ClusterNode, with_cluster
from .pins import ClusterPins, Replication
from .rest import ClusterClient
from .status import PinStatus, parse_pin_status

__all__ = [
    "ClusterClient",
    "ClusterNode",
    "ClusterPeer",
    "ClusterPins",
    "PinStatus",
    "Replication",
    "find_cluster_bin_dir",
    "new_secret",
    "parse_pin_status",
    "stop_peers",
    "with_cluster",
]
