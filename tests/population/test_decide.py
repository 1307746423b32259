"""The pure population decision: Ray Tune's quantiles and explore, on a stream any machine re-derives."""

from __future__ import annotations

import hashlib

import pytest

from gradstore.dag.cid import CID, RAW
from gradstore.population import (
    Choice,
    MemberFailure,
    MemberScore,
    PopulationParams,
    Range,
    Stream,
    decide,
    explore,
    quantile_size,
    stream_key,
)

LRS = (0.001, 0.003, 0.01, 0.03, 0.1)
PARAMS = PopulationParams({"lr": Choice(LRS), "wd": Range(0.0, 0.001)})


def ckpt(i: int) -> CID:
    return CID.hash(RAW, f"checkpoint {i}".encode())


def member(i: int) -> str:
    return f"did:key:m{i:02d}"  # the pure decision never parses a did


def scores(values: list[float]) -> list[MemberScore]:
    return [
        MemberScore(member(i), ckpt(i), v, {"lr": LRS[i % 5], "wd": 0.0001 * (i + 1)})
        for i, v in enumerate(values)
    ]


def test_stream_is_sha256_in_counter_mode() -> None:
    key = stream_key("runid1234", 7, 3)
    expected_key = hashlib.sha256(
        b"gradstore/population/1\x00runid1234\x00" + (7).to_bytes(8, "big") + (3).to_bytes(8, "big")
    ).digest()
    assert key == expected_key
    block0 = hashlib.sha256(key + (0).to_bytes(8, "big")).digest()
    block1 = hashlib.sha256(key + (1).to_bytes(8, "big")).digest()
    draws = [int.from_bytes(b[i : i + 8], "big") for b in (block0, block1) for i in range(0, 32, 8)]
    rng = Stream(key)
    assert rng.uniform() == (draws[0] >> 11) / 2**53
    assert rng.below(10) == ((draws[1] >> 11) * 10) >> 53
    assert [rng.below(2**20) for _ in range(6)] == [((d >> 11) * 2**20) >> 53 for d in draws[2:]]


def test_quantile_size_is_rays() -> None:
    # ceil(n * q), at most floor(n / 2); nothing below 2 members
    assert [quantile_size(n, 0.25) for n in range(1, 10)] == [0, 1, 1, 1, 2, 2, 2, 2, 3]
    assert quantile_size(5, 0.5) == 2
    assert quantile_size(8, 0.0) == 0
    assert quantile_size(8, 0.5) == 4


def test_bottom_quantile_copies_a_top_quantile_member() -> None:
    got = decide(
        scores([0.5, 0.9, 0.1, 0.7, 0.3, 0.8, 0.2, 0.6]),
        [],
        PARAMS,
        run="r" * 8,
        seed=1,
        interval=0,
    )
    assert got.bottom == (member(2), member(6))
    assert got.top == (member(5), member(1))
    assert [c.member for c in got.copies] == [member(2), member(6)]
    by_member = {s.member: s for s in scores([0.5, 0.9, 0.1, 0.7, 0.3, 0.8, 0.2, 0.6])}
    for c in got.copies:
        assert c.source in got.top
        assert c.checkpoint == by_member[c.source].checkpoint
        PARAMS.check_hparams(c.hparams)


def test_mode_min_ranks_low_scores_best() -> None:
    params = PopulationParams(PARAMS.mutations, mode="min")
    got = decide(scores([0.5, 0.9, 0.1, 0.7]), [], params, run="r" * 8, seed=1, interval=0)
    assert got.bottom == (member(1),)
    assert got.top == (member(2),)
    assert [(c.member, c.source) for c in got.copies] == [(member(1), member(2))]


def test_ties_rank_the_smaller_did_lower() -> None:
    got = decide(scores([0.5, 0.5, 0.5, 0.5]), [], PARAMS, run="r" * 8, seed=1, interval=0)
    assert got.ranking == (member(0), member(1), member(2), member(3))
    assert got.bottom == (member(0),) and got.top == (member(3),)


def test_failed_members_are_refilled_by_exploit() -> None:
    failures = [MemberFailure(member(9), "absent: never reported")]
    got = decide(scores([0.5, 0.9, 0.1, 0.7]), failures, PARAMS, run="r" * 8, seed=1, interval=0)
    assert [c.member for c in got.copies] == [member(2), member(9)]
    assert all(c.source == member(1) for c in got.copies)  # the top quantile is one member
    # with no quantile at all (quantile_fraction 0), a failed member copies the best one
    none = PopulationParams(PARAMS.mutations, quantile_fraction=0.0)
    got = decide(scores([0.5, 0.9, 0.1, 0.7]), failures, none, run="r" * 8, seed=1, interval=0)
    assert [(c.member, c.source) for c in got.copies] == [(member(9), member(1))]
    # with nobody to copy, nobody copies
    assert decide([], failures, PARAMS, run="r" * 8, seed=1, interval=0).copies == ()


def test_a_member_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        decide(
            scores([0.5]),
            [MemberFailure(member(0), "absent")],
            PARAMS,
            run="r" * 8,
            seed=1,
            interval=0,
        )


def test_decision_is_a_function_of_run_seed_and_interval() -> None:
    values = [0.5, 0.9, 0.1, 0.7, 0.3, 0.8, 0.2, 0.6]
    one = [
        decide(scores(values), [], PARAMS, run="r" * 8, seed=s, interval=i)
        for s in (1, 2)
        for i in (0, 1)
    ]
    again = [
        decide(scores(values), [], PARAMS, run="r" * 8, seed=s, interval=i)
        for s in (1, 2)
        for i in (0, 1)
    ]
    assert one == again
    assert len({tuple(tuple(sorted(c.hparams.items())) for c in d.copies) for d in one}) > 1


def test_explore_list_shifts_to_a_neighbour_and_clamps() -> None:
    params = PopulationParams({"lr": Choice(LRS)}, resample_probability=0.0)
    seen = {
        explore({"lr": 0.01}, params, Stream(stream_key("r" * 8, s, 0)))["lr"] for s in range(64)
    }
    assert seen == {0.003, 0.03}
    seen = {
        explore({"lr": 0.001}, params, Stream(stream_key("r" * 8, s, 0)))["lr"] for s in range(64)
    }
    assert seen == {0.001, 0.003}  # a shift left at the end is a no-op, as in Ray
    # a value not in the list is always resampled
    seen = {
        explore({"lr": 0.5}, params, Stream(stream_key("r" * 8, s, 0)))["lr"] for s in range(200)
    }
    assert seen == set(LRS)


def test_explore_range_perturbs_by_a_factor_or_resamples() -> None:
    params = PopulationParams({"wd": Range(0.0, 1.0)}, resample_probability=0.0)
    seen = {
        explore({"wd": 0.5}, params, Stream(stream_key("r" * 8, s, 0)))["wd"] for s in range(64)
    }
    assert seen == {0.5 * 1.2, 0.5 * 0.8}
    params = PopulationParams({"wd": Range(2.0, 3.0)}, resample_probability=1.0)
    got = [explore({"wd": 0.5}, params, Stream(stream_key("r" * 8, s, 0)))["wd"] for s in range(64)]
    assert all(2.0 <= v < 3.0 for v in got) and len(set(got)) == 64


def test_resample_probability_is_the_share_of_resamples() -> None:
    params = PopulationParams({"wd": Range(2.0, 3.0)})  # default 0.25
    got = [
        explore({"wd": 0.5}, params, Stream(stream_key("r" * 8, s, 0)))["wd"] for s in range(2000)
    ]
    share = sum(v >= 2.0 for v in got) / len(got)
    assert 0.21 < share < 0.29


def test_defaults_are_rays() -> None:
    p = PopulationParams({"lr": Choice(LRS)})
    assert (p.quantile_fraction, p.resample_probability, p.perturbation_factors, p.mode) == (
        0.25,
        0.25,
        (1.2, 0.8),
        "max",
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"quantile_fraction": 0.6}, "quantile_fraction"),
        ({"resample_probability": 1.5}, "resample_probability"),
        ({"perturbation_factors": ()}, "perturbation_factors"),
        ({"mode": "best"}, "mode"),
    ],
)
def test_bad_knobs_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PopulationParams({"lr": Choice(LRS)}, **kwargs)  # type: ignore[arg-type]


def test_hyperparameters_must_fit_the_space() -> None:
    with pytest.raises(ValueError, match="not the space"):
        PARAMS.check_hparams({"lr": 0.01})
    with pytest.raises(ValueError, match="must be a float"):
        PARAMS.check_hparams({"lr": 0.01, "wd": 0})
    with pytest.raises(ValueError, match="twice"):
        Choice((1, 2, 1))
    with pytest.raises(ValueError, match="low < high"):
        Range(1.0, 1.0)
