"""A job split among several coordinators by steps (``[[steps]] coordinator``): who owns
which step, and the jobs that refuse a split (docs/design/multicoord.md)."""

from __future__ import annotations

from typing import Any

import pytest

from gradstore.errors import ConfigError
from gradstore.job import parse_job
from gradstore.messages import SigningKey

ROOT = SigningKey.from_seed(bytes([200]) * 32).did
OWNER = SigningKey.from_seed(bytes([201]) * 32).did
THIRD = SigningKey.from_seed(bytes([202]) * 32).did
P = sorted(SigningKey.from_seed(bytes([i + 1]) * 32).did for i in range(3))


def _job(*owners: str | None, **extra: Any) -> dict[str, Any]:
    steps = []
    for i, owner in enumerate(owners):
        step: dict[str, Any] = {"name": f"s{i}", "tensors": [f"l{i}.*"]}
        if owner is not None:
            step["coordinator"] = owner
        steps.append(step)
    return {"job": "j", "coordinator": ROOT, "peers": P, "steps": steps, **extra}


def test_each_step_is_owned_by_its_coordinator_or_the_jobs() -> None:
    cfg = parse_job(_job(OWNER, None, THIRD, OWNER))
    assert cfg.coordinators == (ROOT, OWNER, THIRD)
    assert [cfg.owner(s) for s in cfg.steps] == [OWNER, ROOT, THIRD, OWNER]
    assert [s.name for s in cfg.steps_of(OWNER)] == ["s0", "s3"]
    assert [s.name for s in cfg.steps_of(ROOT)] == ["s1"]
    assert cfg.steps_of(P[0]) == ()


def test_a_step_naming_the_jobs_coordinator_is_not_a_split() -> None:
    cfg = parse_job(_job(ROOT, None))
    assert cfg.coordinators == (ROOT,)
    assert all(s.coordinator is None for s in cfg.steps)
    assert cfg.steps == parse_job(_job(None, None)).steps  # the same job as before


def test_a_job_without_steps_has_one_coordinator() -> None:
    cfg = parse_job({"job": "j", "coordinator": ROOT, "peers": P})
    assert cfg.coordinators == (ROOT,)
    assert cfg.steps_of(ROOT) == cfg.steps


@pytest.mark.parametrize("bad", ["nope", 7, "did:key:z6Mkinvalid", ["x"]])
def test_a_steps_coordinator_must_be_a_did_key(bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"`steps\[1\]\.coordinator`"):
        parse_job(_job(None, bad))  # type: ignore[arg-type]


def test_a_pipeline_job_cannot_be_split() -> None:
    raw: dict[str, Any] = {
        "job": "j",
        "coordinator": ROOT,
        "peers": P[:2],
        "stages": [
            {"name": "body", "tensors": ["fc1.*"], "peers": P[:1]},
            {"name": "head", "tensors": ["fc2.*"], "peers": P[1:2], "coordinator": OWNER},
        ],
    }
    with pytest.raises(ConfigError, match=r"`stages` a step names another coordinator"):
        parse_job(raw)
    raw["stages"][1]["coordinator"] = ROOT
    assert parse_job(raw).coordinators == (ROOT,)


def test_a_population_job_cannot_be_split() -> None:
    population = {"intervals": 1, "interval_steps": 1, "hyperparam_mutations": {"lr": [0.1, 0.2]}}
    with pytest.raises(ConfigError, match=r"`steps\[0\]\.coordinator`.*\[population\]"):
        parse_job(_job(OWNER, population=population))
    assert parse_job(_job(ROOT, population=population)).coordinators == (ROOT,)


def test_each_coordinator_runs_only_the_steps_it_owns(tmp_path: Any) -> None:
    from gradstore.coordinator import Coordinator

    cfg = parse_job(_job(OWNER, None, OWNER))
    keys = {k.did: k for k in (SigningKey.from_seed(bytes([b]) * 32) for b in (200, 201, 202))}
    root = Coordinator(cfg, keys[ROOT], None, tmp_path / "root")  # type: ignore[arg-type]
    owner = Coordinator(cfg, keys[OWNER], None, tmp_path / "owner")  # type: ignore[arg-type]
    assert list(root.state.steps) == ["s1"] and root.state.steps.root
    assert root.state.steps.others == {"s0": OWNER, "s2": OWNER}
    assert root.state.steps.ends == ("s0", "s1", "s2")  # the root ends a round on every step
    assert list(owner.state.steps) == ["s0", "s2"] and not owner.state.steps.root
    assert owner.state.steps.ends == ("s0", "s2")
    assert cfg.step_owners == {"s0": OWNER, "s2": OWNER}
    with pytest.raises(ConfigError, match="nor the owner of any of its steps"):
        Coordinator(cfg, keys[THIRD], None, tmp_path / "third")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="owns no step"):  # the owners learn the run from it
        Coordinator(parse_job(_job(OWNER)), keys[OWNER], None, tmp_path / "o")  # type: ignore[arg-type]
