"""The job file's ``[pinning]`` table: pin what a round keeps through IPFS Cluster.

[pinning]
cluster = "http://127.0.0.1:9094"   the cluster's REST API
replication_min = 2                  a close waits until this many peers pin its aggregate and record
replication_max = 3                  at most this many peers pin each CID
wait_s = 60                          how long one pin waits for replication_min (the close retries)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._aggregation import Where

DEFAULT_WAIT_S = 60.0


@dataclass(frozen=True)
class PinningConfig:
    """Pin through the cluster at ``cluster`` on ``replication_min``..``replication_max`` peers."""

    cluster: str
    replication_min: int = 1
    replication_max: int = 1
    wait_s: float = DEFAULT_WAIT_S


def parse_pinning(raw: Any, where: Where) -> PinningConfig:
    """Validate ``[pinning]``: a cluster URL and 1 <= replication_min <= replication_max."""
    where.keys(raw, {"cluster", "replication_min", "replication_max", "wait_s"}, "pinning.")
    assert isinstance(raw, Mapping)
    cluster = where.req(raw, "cluster", str, "pinning.")
    if not cluster.startswith(("http://", "https://")):
        raise where.err("pinning.cluster", f"must be an http(s) URL, not {cluster!r}")
    low = where.int_(raw.get("replication_min", 1), "pinning.replication_min", 1)
    high = where.int_(raw.get("replication_max", low), "pinning.replication_max", 1)
    if high < low:
        raise where.err("pinning.replication_max", f"{high} is less than replication_min {low}")
    wait_s = where.num(raw.get("wait_s", DEFAULT_WAIT_S), "pinning.wait_s", positive=True)
    return PinningConfig(cluster, low, high, wait_s)
