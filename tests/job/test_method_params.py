"""A method owns its parameters: a new method class with parameters of its own is read
from the job file, aggregated with, recorded and read back from a record, with no other
change (the registry only lists it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from gradstore.aggregate import AggregationParams, aggregate
from gradstore.aggregate.methods import REGISTRY, Linear
from gradstore.errors import CoordinatorError
from gradstore.job import parse_job
from gradstore.messages import SigningKey

COORD = SigningKey.from_seed(bytes([200]) * 32).did
P = sorted(SigningKey.from_seed(bytes([i + 1]) * 32).did for i in range(3))


@dataclass(frozen=True)
class Scaled(Linear):
    """A method no release has: the sum times ``factor``; ``spare`` is an integer it keeps."""

    name: ClassVar[Any] = "scaled"
    factor: float | None = None
    spare: int | None = None

    def terms(
        self, n: int, num_samples: Sequence[int] | None
    ) -> tuple[list[float] | None, float | None]:
        assert self.factor is not None
        return [self.factor] * n, None


@pytest.fixture
def scaled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, "scaled", Scaled)


def _job(**aggregation: Any) -> dict[str, Any]:
    return {"job": "j", "coordinator": COORD, "peers": P, "aggregation": aggregation}


def test_a_new_methods_parameters_go_from_the_job_to_the_record_and_back(scaled: None) -> None:
    cfg = parse_job(_job(method="scaled", factor=2, spare=7, clip_output_norm=100))
    assert cfg.method_params == {"factor": 2.0, "spare": 7}
    assert type(cfg.method_params["factor"]) is float  # read as its class declares it
    params = cfg.params_for(P)
    assert params.strategy == Scaled(factor=2.0, spare=7) and params.factor == 2.0
    record = params.to_record()
    assert record == {"factor": 2.0, "spare": 7, "clip_output_norm": 100.0}
    assert AggregationParams.from_record("scaled", record) == params
    inputs = [{"w": np.full(3, float(i + 1), np.float32)} for i in range(3)]
    assert aggregate(inputs, params)["w"].tolist() == [12.0] * 3


@pytest.mark.parametrize(
    ("aggregation", "message"),
    [
        ({"method": "mean", "factor": 2}, "`aggregation.factor` factor does not apply to method"),
        ({"method": "scaled", "spare": 1.5}, "`aggregation.spare` must be an integer"),
        ({"method": "scaled", "factor": "x"}, "`aggregation.factor` must be a finite number"),
        ({"method": "scaled", "fctor": 1}, "`aggregation.fctor` is not a known key"),
    ],
)
def test_a_new_methods_parameters_are_checked_by_key(
    scaled: None, aggregation: dict[str, Any], message: str
) -> None:
    with pytest.raises(CoordinatorError, match=message):
        parse_job(_job(**aggregation))


def test_weighted_turns_the_jobs_weights_per_peer_into_weights_per_input() -> None:
    cfg = parse_job(_job(method="weighted", weights={P[0]: 1, P[1]: 2, P[2]: 3}))
    assert cfg.method_params == {}
    assert cfg.params_for([P[2], P[0]]).to_record() == {"weights": [3.0, 1.0]}
    assert parse_job(_job(method="median")).params_for(P).to_record() == {}


def test_exact_accumulation_goes_from_the_job_to_the_record_and_back() -> None:
    cfg = parse_job(_job(method="fedavg", accumulate="exact"))
    assert cfg.method_params == {"accumulate": "exact"}
    params = cfg.params_for(P)
    assert params.to_record() == {"accumulate": "exact"}
    assert AggregationParams.from_record("fedavg", params.to_record()) == params
    weighted = parse_job(
        _job(method="weighted", accumulate="exact", weights={p: i + 1 for i, p in enumerate(P)})
    )
    assert weighted.params_for(P).to_record() == {"accumulate": "exact", "weights": [1.0, 2.0, 3.0]}
    # "ordered", the default, is left out of the record: the CIDs of such rounds do not change
    assert parse_job(_job(method="mean", accumulate="ordered")).params_for(P).to_record() == {}
    with pytest.raises(CoordinatorError, match="accumulate does not apply to method 'median'"):
        parse_job(_job(method="median", accumulate="exact"))
    with pytest.raises(CoordinatorError, match="accumulate must be one of"):
        parse_job(_job(method="mean", accumulate="fast"))
