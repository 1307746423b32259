"""Aggregation methods are small typed classes, one per module, with their own checks."""

from __future__ import annotations

import importlib

import pytest

from gradstore.aggregate import METHODS, AggregationParams
from gradstore.aggregate import methods as m
from gradstore.errors import AggregationError


def test_every_method_is_one_class_in_a_module_of_its_own_name() -> None:
    assert tuple(m.REGISTRY) == METHODS
    for name, cls in m.REGISTRY.items():
        module = importlib.import_module(f"gradstore.aggregate.methods.{name}")
        assert cls.__module__ == module.__name__ and cls.name == name


@pytest.mark.parametrize(
    ("params", "kind", "expected"),
    [
        (AggregationParams("sum"), m.Linear, m.Sum()),
        (AggregationParams("weighted", weights=(1, 2)), m.Linear, m.Weighted((1.0, 2.0))),
        (AggregationParams("trimmed_mean", trim_ratio=0.2), m.OrderStatistic, m.TrimmedMean(0.2)),
        (AggregationParams("multikrum", byzantine=1, select=2), m.Selection, m.MultiKrum(1, 2)),
    ],
)
def test_parameters_become_the_method_object_the_engines_run(
    params: AggregationParams, kind: type, expected: m.Method
) -> None:
    assert isinstance(params.strategy, kind) and params.strategy == expected
    assert params.to_record() == expected.params()  # what a round record stores


def test_the_engines_ask_the_method_not_its_name() -> None:
    assert m.Mean().terms(4, None) == (None, 4.0)
    assert m.FedAvg().terms(2, [1, 3]) == ([1.0, 3.0], 4.0)
    assert m.Median().rows(4) == (1, 3) and m.TrimmedMean(0.25).rows(8) == (2, 6)
    assert m.Krum(1).chosen(5) == 1 and m.MultiKrum(1).chosen(5) == 4
    with pytest.raises(AggregationError, match="num_samples"):
        m.FedAvg().terms(2, [1])


def test_a_parameter_a_method_does_not_take_is_refused() -> None:
    with pytest.raises(AggregationError, match="trim_ratio does not apply to method 'mean'"):
        AggregationParams("mean", trim_ratio=0.1)
    with pytest.raises(AggregationError, match="unknown aggregation method 'avg'"):
        AggregationParams("avg")
