"""Which Flower strategies GradstoreStrategy may wrap: those whose own aggregation it replaces
without losing anything, i.e. FedAvg's ``aggregate_train`` (FedAvg, FedProx, a subclass that
only changes client selection or instructions).

A strategy whose value lies in its ``aggregate_train`` (FedMedian, Krum, FedAdam's server
optimizer, the differential-privacy wrappers' noise) would silently not run: gradstore
combines the arrays with its own method. Such a strategy is refused at construction with
gradstore's nearest method where there is one, unless the caller says the replacement is
meant (``replace_aggregation=True``).
"""

from __future__ import annotations

from typing import Any

from flwr.serverapp.strategy import FedAvg, Strategy

from ..errors import ConfigError


def gradstore_equivalent(inner: Any) -> str | None:
    """The GradstoreStrategy arguments that combine as ``inner`` does, or None."""
    name = type(inner).__name__
    if name == "FedMedian":
        return 'method="median"'
    if name == "FedTrimmedAvg":
        return f'method="trimmed_mean", trim_ratio={getattr(inner, "beta", 0.2)}'
    if name == "Krum":
        return f'method="krum", byzantine={getattr(inner, "num_malicious_nodes", 0)}'
    if name == "MultiKrum":
        return (
            f'method="multikrum", byzantine={getattr(inner, "num_malicious_nodes", 0)}, '
            f"select={getattr(inner, 'num_nodes_to_select', 1)}"
        )
    return None


def check_inner(inner: Strategy, *, replace_aggregation: bool) -> None:
    """Raise ``ConfigError`` (a ValueError) if wrapping ``inner`` would silently drop its own
    aggregation."""
    # the bound method's function: catches an aggregate_train set on the instance too
    own = getattr(inner.aggregate_train, "__func__", None)
    if replace_aggregation or own is FedAvg.aggregate_train:
        return
    name = type(inner).__name__
    equivalent = gradstore_equivalent(inner)
    advice = (
        f"wrap FedAvg (or nothing) and pass {equivalent}, gradstore's own, which the "
        "round record names and an auditor recomputes"
        if equivalent is not None
        else "gradstore has no equivalent of it; wrap FedAvg, FedProx or a strategy that "
        "aggregates as FedAvg does"
    )
    raise ConfigError(
        f"{name} combines the arrays in its own aggregate_train, which GradstoreStrategy "
        f"replaces with gradstore's method: {advice}. Pass replace_aggregation=True to "
        f"wrap {name} anyway (only its client selection, instructions, metrics and "
        "evaluation are then used)"
    )
