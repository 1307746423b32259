"""A wrapped Flower strategy whose own aggregation would silently not run is refused, with
gradstore's equivalent when there is one; strategies that aggregate as FedAvg does are not."""

from __future__ import annotations

from typing import Any

import pytest
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import (
    Bulyan,
    DifferentialPrivacyServerSideFixedClipping,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    FedYogi,
    Krum,
    MultiKrum,
    Strategy,
)

from gradstore.flower import GradstoreStrategy

#: Never contacted: every strategy here is refused before the node is used, or only built.
NOWHERE = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("inner", "advice"),
    [
        (FedMedian(), 'method="median"'),
        (FedTrimmedAvg(beta=0.3), 'method="trimmed_mean", trim_ratio=0.3'),
        (Krum(num_malicious_nodes=1), 'method="krum", byzantine=1'),
        (
            MultiKrum(num_malicious_nodes=1, num_nodes_to_select=2),
            'method="multikrum", byzantine=1, select=2',
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Strategy) else "",
)
def test_a_robust_flower_aggregator_is_refused_with_gradstores_equivalent(
    inner: Strategy, advice: str
) -> None:
    with pytest.raises(ValueError, match=type(inner).__name__) as info:
        GradstoreStrategy(inner, node=NOWHERE)
    assert f"pass {advice}" in str(info.value)
    assert "replace_aggregation=True" in str(info.value)


@pytest.mark.parametrize(
    "inner",
    [
        FedAdam(),
        FedYogi(),
        FedAvgM(),
        Bulyan(),
        DifferentialPrivacyServerSideFixedClipping(
            FedAvg(), noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=2
        ),
    ],
    ids=lambda s: type(s).__name__,
)
def test_a_strategy_that_post_processes_the_arrays_is_refused(inner: Strategy) -> None:
    # FedAdam's server optimizer or the DP wrapper's noise would not be applied: say so
    with pytest.raises(ValueError, match="gradstore has no equivalent") as info:
        GradstoreStrategy(inner, node=NOWHERE)
    assert type(inner).__name__ in str(info.value)


class LoggingFedAvg(FedAvg):
    """A user's FedAvg whose aggregate_train does something of its own."""

    def aggregate_train(
        self, server_round: int, replies: Any
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return super().aggregate_train(server_round, replies)


class PickyFedAvg(FedAvg):
    """A user's FedAvg that only changes the instructions: its aggregation is FedAvg's."""

    def configure_train(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Any:
        return super().configure_train(server_round, arrays, config, grid)


def test_a_subclass_overriding_aggregate_train_is_refused_unless_replacement_is_meant() -> None:
    with pytest.raises(ValueError, match="LoggingFedAvg combines the arrays"):
        GradstoreStrategy(LoggingFedAvg(), node=NOWHERE)
    with GradstoreStrategy(LoggingFedAvg(), node=NOWHERE, replace_aggregation=True) as s:
        assert isinstance(s.inner, LoggingFedAvg)
    with GradstoreStrategy(FedAdam(), node=NOWHERE, replace_aggregation=True) as s:
        assert isinstance(s.inner, FedAdam)


def test_an_aggregate_train_set_on_the_instance_is_seen_too() -> None:
    inner = FedAvg()
    inner.aggregate_train = lambda server_round, replies: (None, None)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="FedAvg combines the arrays"):
        GradstoreStrategy(inner, node=NOWHERE)


@pytest.mark.parametrize("inner", [None, FedAvg(), FedProx(proximal_mu=0.1), PickyFedAvg()])
def test_strategies_that_aggregate_as_fedavg_does_are_wrapped(inner: Strategy | None) -> None:
    with GradstoreStrategy(inner, node=NOWHERE) as s:
        assert isinstance(s.inner, FedAvg)


def test_a_misplaced_aggregation_parameter_is_refused_when_the_strategy_is_built() -> None:
    from gradstore.errors import AggregationError

    with pytest.raises(AggregationError, match="trim_ratio does not apply to method 'fedavg'"):
        GradstoreStrategy(node=NOWHERE, trim_ratio=0.2)
    with pytest.raises(AggregationError, match="unknown aggregation method 'avg'"):
        GradstoreStrategy(node=NOWHERE, method="avg")
