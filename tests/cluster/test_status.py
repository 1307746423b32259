"""Reading IPFS Cluster's pin status without I/O, and the replication factors' rule."""

from __future__ import annotations

import pytest

from gradstore.errors import ClusterError, ConfigError
from gradstore.node.cluster import Replication, parse_pin_status
from gradstore.node.cluster.status import error_message, not_enough_peers, parse_peers

BODY = {
    "cid": "bafkqaaa",
    "allocations": ["peerA", "peerB"],
    "peer_map": {
        "peerA": {"status": "pinned", "error": ""},
        "peerB": {"status": "pin_error", "error": "context deadline exceeded"},
        "peerC": {"status": "remote", "error": ""},
    },
}


def test_a_status_counts_the_peers_that_pin_and_names_why_others_do_not() -> None:
    status = parse_pin_status(BODY)
    assert status.pinned == 1
    assert status.allocations == ("peerA", "peerB")
    assert status.describe() == (
        "peerA: pinned, peerB: pin_error (context deadline exceeded), peerC: remote"
    )


def test_an_answer_without_a_peer_map_is_a_cluster_error() -> None:
    with pytest.raises(ClusterError, match="peer_map"):
        parse_pin_status({"code": 500})


def test_peers_are_one_json_object_a_line() -> None:
    assert [p["id"] for p in parse_peers('{"id":"a"}\n\n{"id":"b"}\n')] == ["a", "b"]


def test_the_not_enough_peers_refusal_is_recognised() -> None:
    text = '{"code":500,"message":"not enough peers to allocate CID. Needed at least: 4."}'
    message = error_message(500, text)
    assert message.startswith("not enough peers") and not_enough_peers(message)


@pytest.mark.parametrize(("low", "high"), [(0, 1), (3, 2), (-1, -1)])
def test_replication_needs_1_le_min_le_max(low: int, high: int) -> None:
    with pytest.raises(ConfigError, match="1 <= replication_min <= replication_max"):
        Replication(low, high)
