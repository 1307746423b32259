"""GradstoreStrategy takes the job as a JobConfig (a job file's own): its method and
parameters, peers, limits and inputs rule the round; the former keywords are a thin shim
that builds the same config."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gradstore.flower import GradstoreClient, GradstoreStrategy, record_cid
from gradstore.format import Limits
from gradstore.job import InputsConfig, JobConfig, parse_job
from gradstore.messages import SigningKey

from .conftest import model
from .test_strategy import _instructions, _verify

NOWHERE = "http://127.0.0.1:9"
COORD = SigningKey.from_seed(bytes([99]) * 32)


def _config(peers: list[SigningKey], **aggregation: Any) -> JobConfig:
    return parse_job(
        {
            "job": "flower-job",
            "coordinator": COORD.did,
            "peers": [k.did for k in peers],
            "aggregation": aggregation,
            "limits": {"max_tensors": 4},
            "inputs": {"require_bound_meta": True},
        }
    )


def test_a_job_config_rules_the_round(api: str, keys: list[SigningKey]) -> None:
    config = _config(keys[:4], method="trimmed_mean", trim_ratio=0.25)
    with GradstoreStrategy(node=api, key=COORD, config=config) as strategy:
        assert strategy.job == "flower-job" and strategy.limits == config.limits
        assert strategy.peers == {k.did for k in keys[:4]} and strategy.require_bound_meta
        msgs = _instructions(strategy, 5)
        senders = [*keys[:4], SigningKey.from_seed(bytes([77]) * 32)]  # the last is no peer
        replies = [
            GradstoreClient(k, send="arrays").reply(m, model(i + 1), 5)
            for i, (k, m) in enumerate(zip(senders, msgs, strict=True))
        ]
        arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None and metrics is not None
    record = _verify(api, record_cid(metrics))
    assert (record.job, record.coordinator) == ("flower-job", COORD.did)
    assert (record.method, record.params) == ("trimmed_mean", {"trim_ratio": 0.25})
    assert sorted(i.peer for i in record.inputs) == sorted(k.did for k in keys[:4])
    assert [e.reason.split(":")[0] for e in record.excluded] == ["unknown-peer"]
    assert senders[-1].did in record.excluded[0].reason


def test_the_former_keywords_build_the_same_config() -> None:
    peers = [SigningKey.from_seed(bytes([i + 1]) * 32).did for i in range(2)]
    kwargs: dict[str, Any] = {
        "job": "j",
        "method": "multikrum",
        "byzantine": 0,
        "select": 1,
        "clip_input_norm": 3.0,
        "peers": peers,
        "limits": Limits(max_tensors=9),
        "require_bound_meta": True,
    }
    with GradstoreStrategy(node=NOWHERE, key=COORD, **kwargs) as old:
        config = old._job
    assert config == JobConfig(
        job="j",
        coordinator=COORD.did,
        peers=tuple(peers),
        method="multikrum",
        method_params={"byzantine": 0, "select": 1},
        clip_input_norm=3.0,
        limits=Limits(max_tensors=9),
        inputs=InputsConfig(require_bound_meta=True),
    )
    with GradstoreStrategy(node=NOWHERE, key=COORD, config=config) as new:
        assert (new.job, new.peers, new.limits, new.require_bound_meta) == (
            old.job,
            old.peers,
            old.limits,
            old.require_bound_meta,
        )
    with GradstoreStrategy(node=NOWHERE) as default:
        assert default._job == JobConfig(job="flower", coordinator=default.key.did, peers=())
        assert default.peers is None  # any client


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"config": "job", "method": "mean"}, TypeError, "not both"),
        ({"methd": "mean"}, TypeError, "unexpected keyword argument 'methd'"),
        ({"peers": []}, ValueError, "peers lists no peer"),
        ({"config": "other"}, ValueError, "pass its key"),
        ({"config": "job", "key": None}, ValueError, "pass its key"),
    ],
)
def test_config_and_keywords_are_refused_when_they_disagree(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    config = _config([COORD])
    other = dataclasses.replace(config, coordinator=SigningKey.from_seed(b"o" * 32).did)
    kwargs = {"key": COORD, **kwargs}
    if "config" in kwargs:
        kwargs["config"] = {"job": config, "other": other}[kwargs["config"]]
    with pytest.raises(error, match=message):
        GradstoreStrategy(node=NOWHERE, **kwargs)
