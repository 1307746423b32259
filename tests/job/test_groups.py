"""A tree job's ``[[groups]]`` (docs/design/multicoord.md, "The tree by peer groups"): every
peer in exactly one group, a linear method accumulated exactly (clipped or not), no steps; and
a group's view of the job (its leaf, peers, topics, quorum), without a network."""

from __future__ import annotations

from typing import Any

import pytest

from gradstore.errors import ConfigError
from gradstore.job import parse_job, topics
from gradstore.messages import SigningKey


def key(i: int) -> SigningKey:
    return SigningKey.from_seed(bytes([i + 1]) * 32)


ROOT, LEAF_A, LEAF_B = key(100), key(110), key(111)
PEERS = [key(i).did for i in range(4)]


def tree_job(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "job": "tree-job",
        "coordinator": ROOT.did,
        "peers": PEERS,
        "aggregation": {"method": "fedavg", "accumulate": "exact"},
        "rounds": {"count": 1, "quorum": 3, "deadline_s": 20.0},
        "groups": [
            {"name": "a", "coordinator": LEAF_A.did, "peers": PEERS[:2]},
            {"name": "b", "coordinator": LEAF_B.did, "peers": PEERS[2:], "quorum": 1},
        ],
    }
    raw.update(changes)
    return raw


def test_a_tree_job_names_its_groups_and_each_groups_view_is_a_job_of_its_own() -> None:
    config = parse_job(tree_job())
    assert config.tree and [g.name for g in config.groups] == ["a", "b"]
    assert config.coordinators == (ROOT.did, LEAF_A.did, LEAF_B.did)
    assert config.group_of(PEERS[3]).name == "b"
    assert config.group_led_by(LEAF_A.did) is config.groups[0]
    assert config.group_led_by(ROOT.did) is None
    a = config.group_view("a")
    assert (a.coordinator, a.root, a.group, a.peers) == (
        LEAF_A.did,
        ROOT.did,
        "a",
        tuple(PEERS[:2]),
    )
    assert not a.tree and a.rounds.quorum == 2  # min(rounds.quorum, its peers)
    assert config.group_view("b").rounds.quorum == 1
    assert (a.gradients_topic, a.results_topic) == topics("tree-job", "a")
    assert a.results_topic != config.results_topic  # the root says its run on the job's
    with pytest.raises(ConfigError, match="no group 'c'"):
        config.group_view("c")


@pytest.mark.parametrize(
    ("groups", "match"),
    [
        (
            [
                {"name": "a", "coordinator": LEAF_A.did, "peers": PEERS},
                {"name": "b", "coordinator": LEAF_B.did, "peers": PEERS[:1]},
            ],
            f"{PEERS[0]} is in group 'a' too",
        ),
        (
            [{"name": "a", "coordinator": LEAF_A.did, "peers": PEERS[:3]}],
            f"puts peer {PEERS[3]} in no group",
        ),
        ([{"name": "a", "coordinator": ROOT.did, "peers": PEERS}], "is the job's coordinator"),
        (
            [
                {"name": "a", "coordinator": LEAF_A.did, "peers": PEERS[:2]},
                {"name": "b", "coordinator": LEAF_A.did, "peers": PEERS[2:]},
            ],
            "leads group 'a' too",
        ),
        (
            [{"name": "a", "coordinator": LEAF_A.did, "peers": [*PEERS, key(9).did]}],
            "not one of the job's peers",
        ),
        ([{"name": "a b", "coordinator": LEAF_A.did, "peers": PEERS}], "groups\\[0\\].name"),
        (
            [{"name": "a", "coordinator": LEAF_A.did, "peers": PEERS, "quorum": 5}],
            "more than the group's 4",
        ),
        ([{"name": "a", "coordinator": LEAF_A.did, "peers": PEERS, "steps": 1}], "not a known key"),
        ([], "non-empty list"),
    ],
)
def test_groups_that_do_not_partition_the_peers_are_refused_naming_why(
    groups: list[dict[str, Any]], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_job(tree_job(groups=groups))


@pytest.mark.parametrize(
    "aggregation",
    [
        {"method": "median"},
        {"method": "trimmed_mean", "trim_ratio": 0.4},
        {"method": "krum", "byzantine": 0},
        {"method": "multikrum", "byzantine": 0, "select": 2},
    ],
)
def test_a_tree_job_refuses_a_method_without_exact_partial_sums(
    aggregation: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError, match="cannot be split into exact partial sums"):
        parse_job(tree_job(aggregation=aggregation))


def test_a_tree_job_refuses_ordered_accumulation_and_steps_and_takes_clipping() -> None:
    with pytest.raises(ConfigError, match='accumulate` must be "exact"'):
        parse_job(tree_job(aggregation={"method": "mean"}))
    clipped = {"method": "sum", "accumulate": "exact", "clip_input_norm": 1.0}
    config = parse_job(tree_job(aggregation={**clipped, "clip_output_norm": 2.0}))
    view = config.group_view(config.groups[0].name)  # the leaf clips its inputs
    assert (view.aggregation.clip_input_norm, view.aggregation.clip_output_norm) == (1.0, 2.0)
    steps = [{"name": "all", "tensors": ["w"]}]
    with pytest.raises(ConfigError, match="cannot be combined with \\[\\[groups\\]\\]"):
        parse_job(tree_job(steps=steps))
