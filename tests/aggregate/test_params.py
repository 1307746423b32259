"""AggregationParams: early refusals, per-count validation, and the round-record form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradstore.aggregate import METHODS, AggregationParams
from gradstore.errors import AggregationError


@pytest.mark.parametrize(
    "params",
    [
        AggregationParams("sum"),
        AggregationParams("mean", clip_input_norm=2.5, clip_output_norm=1),
        AggregationParams("weighted", weights=(1, 0.5, 2)),
        AggregationParams("trimmed_mean", trim_ratio=0.25),
        AggregationParams("krum", byzantine=1),
        AggregationParams("multikrum", byzantine=2, select=3, clip_input_norm=10.0),
    ],
    ids=lambda p: p.method,
)
def test_record_round_trip(params: AggregationParams) -> None:
    record = params.to_record()
    assert "method" not in record
    assert AggregationParams.from_record(params.method, record) == params


def test_record_is_plain_and_in_field_order() -> None:
    params = AggregationParams(
        "multikrum",
        byzantine=np.int64(1),  # type: ignore[arg-type]
        select=2,
        clip_output_norm=3,
        clip_input_norm=4,
    )
    record = params.to_record()
    assert list(record) == ["byzantine", "select", "clip_input_norm", "clip_output_norm"]
    assert record == {"byzantine": 1, "select": 2, "clip_input_norm": 4.0, "clip_output_norm": 3.0}
    assert type(record["byzantine"]) is int and type(record["clip_input_norm"]) is float
    from_list = AggregationParams("weighted", weights=[1, 2])  # type: ignore[arg-type]
    weights = from_list.to_record()["weights"]
    assert weights == [1.0, 2.0] and all(type(w) is float for w in weights)


def test_from_record_refuses_unknown_keys() -> None:
    with pytest.raises(AggregationError, match="unknown aggregation parameter"):
        AggregationParams.from_record("mean", {"trim": 0.1})


def test_methods_are_the_design_list() -> None:
    assert METHODS == (
        "sum", "mean", "fedavg", "weighted", "median", "trimmed_mean", "krum", "multikrum",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "average"}, "unknown aggregation method"),
        ({"method": "mean", "weights": (1.0,)}, "weights does not apply to method 'mean'"),
        ({"method": "median", "trim_ratio": 0.1}, "trim_ratio does not apply"),
        ({"method": "fedavg", "byzantine": 1}, "byzantine does not apply"),
        ({"method": "krum", "byzantine": 1, "select": 2}, "select does not apply to method 'krum'"),
        ({"method": "weighted", "weights": (1.0, -0.5)}, "must not be negative"),
        ({"method": "weighted", "weights": (1.0, math.nan)}, "weights must be finite"),
        ({"method": "weighted", "weights": "12"}, "sequence of numbers"),
        ({"method": "trimmed_mean", "trim_ratio": 0.5}, r"trim_ratio must be in \[0, 0.5\)"),
        ({"method": "trimmed_mean", "trim_ratio": -0.1}, r"trim_ratio must be in \[0, 0.5\)"),
        ({"method": "krum", "byzantine": -1}, "byzantine must be >= 0"),
        ({"method": "krum", "byzantine": True}, "byzantine must be an integer"),
        ({"method": "multikrum", "byzantine": 1, "select": 0}, "select must be >= 1"),
        ({"method": "mean", "clip_input_norm": 0.0}, "clip_input_norm must be > 0"),
        ({"method": "mean", "clip_output_norm": math.inf}, "clip_output_norm must be finite"),
    ],
)
def test_construction_refuses(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(AggregationError, match=message):
        AggregationParams(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("params", "n", "message"),
    [
        (AggregationParams("mean"), 0, "no inputs"),
        (AggregationParams("weighted"), 2, "weights are required"),
        (AggregationParams("weighted", weights=(1.0, 2.0)), 3, "2 weights for 3 inputs"),
        (AggregationParams("weighted", weights=(0.0, 0.0)), 2, "all weights are zero"),
        (AggregationParams("median"), 2, "cannot outvote anyone"),
        (AggregationParams("trimmed_mean"), 5, "trim_ratio is required"),
        (AggregationParams("trimmed_mean", trim_ratio=0.1), 9, "trims nothing"),
        (AggregationParams("krum"), 5, "byzantine .* is required"),
        (AggregationParams("krum", byzantine=1), 4, "n >= 2f \\+ 3 = 5"),
        (AggregationParams("multikrum", byzantine=2), 6, "n >= 2f \\+ 3 = 7"),
        (AggregationParams("multikrum", byzantine=1, select=5), 5, "more than n - f = 4"),
    ],
)
def test_validate_refuses(params: AggregationParams, n: int, message: str) -> None:
    with pytest.raises(AggregationError, match=message):
        params.validate(n)


@pytest.mark.parametrize(
    ("params", "n"),
    [
        (AggregationParams("mean"), 1),
        (AggregationParams("median"), 3),
        (AggregationParams("trimmed_mean", trim_ratio=0.1), 10),
        (AggregationParams("trimmed_mean", trim_ratio=0.3), 10),
        (AggregationParams("trimmed_mean", trim_ratio=0.0), 2),
        (AggregationParams("krum", byzantine=1), 5),
        (AggregationParams("multikrum", byzantine=1, select=4), 5),
        (AggregationParams("weighted", weights=(0.0, 1.0)), 2),
    ],
)
def test_validate_accepts_the_boundary(params: AggregationParams, n: int) -> None:
    params.validate(n)
