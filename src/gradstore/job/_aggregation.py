"""The aggregation keys of a job file, read by one function for the job's ``[aggregation]``
and for each ``[[steps]]`` table that overrides it, so both are checked the same way."""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from ..aggregate import CLIP_PARAMETERS, AggregationParams, parameter_names
from ..aggregate.methods import REGISTRY, MethodName, method_class
from ..errors import AggregationError


class Where(Protocol):
    """What the job file's reader offers: errors naming the file and the key, typed reads."""

    def err(self, key: str, message: str) -> Exception: ...

    def keys(self, table: Any, allowed: set[str], prefix: str) -> None: ...

    def req(self, table: Mapping[str, Any], key: str, kind: type, prefix: str) -> Any: ...

    def num(self, value: Any, key: str, positive: bool = False) -> float: ...

    def int_(self, value: Any, key: str, minimum: int) -> int: ...

    def did(self, value: Any, key: str) -> str: ...


@dataclass(frozen=True)
class Aggregation:
    """A method, its own parameters, weights per peer (for ``weighted``) and the clipping
    bounds: the job's ``[aggregation]``, or a step's override of it."""

    method: MethodName = "fedavg"
    weights: Mapping[str, float] = field(default_factory=dict)
    #: The method's own parameters by name (``{"trim_ratio": 0.2}``): its class's fields.
    method_params: Mapping[str, Any] = field(default_factory=dict)
    clip_input_norm: float | None = None
    clip_output_norm: float | None = None

    def params_for(self, peers: Sequence[str]) -> AggregationParams:
        """Aggregation parameters for inputs from ``peers`` (in that order): the method sets
        itself up from these settings (``Method.for_round``)."""
        strategy = method_class(self.method).for_round(self.method_params, self.weights, peers)
        return AggregationParams(
            self.method,
            strategy=strategy,
            clip_input_norm=self.clip_input_norm,
            clip_output_norm=self.clip_output_norm,
        )


def aggregation_keys() -> set[str]:
    """The keys an aggregation table may hold: ``method`` and every parameter's name."""
    return {"method", *parameter_names()}


def parse_aggregation(
    table: Mapping[str, Any],
    where: Where,
    prefix: str,
    peers: Sequence[str],
    base: Aggregation | None = None,
) -> Aggregation:
    """Read the aggregation keys of ``table`` (errors name ``prefix + key``) over ``base``.

    A key ``table`` gives wins over ``base``'s. If ``table`` names another method than
    ``base``'s, ``base``'s method parameters and weights do not carry over (they belong to
    its method); clipping does. Weights must be for ``peers`` only, every one of them for
    ``weighted``; inherited weights are cut down to ``peers``."""
    base = base if base is not None else Aggregation()
    method = table.get("method", base.method)
    if not isinstance(method, str) or method not in REGISTRY:
        raise where.err(
            prefix + "method", f"unknown method {method!r} (one of {', '.join(REGISTRY)})"
        )
    same = method == base.method
    if "weights" in table:
        weights = _weights(table["weights"], where, prefix + "weights", method, peers)
    else:
        weights = {p: w for p, w in base.weights.items() if p in peers} if same else {}
    if method == "weighted":
        missing = [p for p in peers if p not in weights]
        if missing:
            raise where.err(
                prefix + "weights",
                f"method 'weighted' needs a weight for every peer; missing {missing[0]}",
            )
    names = parameter_names()
    listed = [key for key in names if key in table and key not in (*CLIP_PARAMETERS, "weights")]
    types = _method_types() if listed else {}  # type hints cost ms: only for a table with some
    own = {
        key: _method_param(table[key], types[key], prefix + key, where)
        for key in listed
        if key in types
    }
    clips = {
        key: where.num(table[key], prefix + key) if key in table else getattr(base, key)
        for key in CLIP_PARAMETERS
    }
    given = {**own, **{k: v for k, v in clips.items() if k in table}}
    for key in names:
        if key in given:  # each on its own first, so the error names its key
            try:
                AggregationParams(method, **{key: given[key]})
            except AggregationError as exc:
                raise where.err(prefix + key, str(exc)) from exc
    return Aggregation(
        method=cast(MethodName, method),
        weights=weights,
        method_params={**(base.method_params if same else {}), **own},
        clip_input_norm=clips["clip_input_norm"],
        clip_output_norm=clips["clip_output_norm"],
    )


def check_sizes(
    aggregation: Aggregation,
    where: Where,
    key: str,
    peers_key: str,
    peers: Sequence[str],
    quorum: int,
    what: str,
) -> None:
    """The checks the aggregator applies, early: for the smallest round ``quorum`` allows (any
    ``quorum`` peers; for ``weighted`` the heaviest, as weights are per peer, not per slot)
    and for the largest, every peer (krum takes at most MAX_KRUM_INPUTS). ``what`` names the
    table in the error on the peers."""
    smallest = sorted(peers, key=lambda p: -aggregation.weights.get(p, 0.0))[:quorum]
    try:
        aggregation.params_for(smallest).validate(quorum)
    except AggregationError as exc:
        raise where.err(key, f"cannot work with quorum {quorum}: {exc}") from exc
    try:
        aggregation.params_for(list(peers)).validate(len(peers))
    except AggregationError as exc:
        raise where.err(peers_key, f"lists {len(peers)} peers, too many for {what}: {exc}") from exc


def _weights(
    raw: Any, where: Where, key: str, method: str, peers: Sequence[str]
) -> dict[str, float]:
    """A weights table: a number >= 0 per peer, only for ``weighted``, only for ``peers``."""
    where.keys(raw, set(raw) if isinstance(raw, Mapping) else set(), key + ".")
    weights = {str(k): where.num(v, f"{key}.{k}") for k, v in raw.items()}
    negative = [k for k, w in weights.items() if w < 0]
    if negative:
        raise where.err(f"{key}.{negative[0]}", "must be >= 0")
    if weights and method != "weighted":
        raise where.err(key, f"does not apply to method {method!r}")
    unknown = [p for p in weights if p not in peers]
    if unknown:
        raise where.err(key, f"weight for a peer not in peers: {unknown[0]}")
    return weights


def _method_types() -> dict[str, Any]:
    """The methods' own parameters (not ``weights``: a table by peer), with their types."""
    return {
        name: kind
        for cls in REGISTRY.values()
        for name, kind in cls.parameter_types().items()
        if name != "weights"
    }


def _method_param(value: Any, kind: Any, key: str, where: Where) -> Any:
    """A method parameter read as its class declares it (an int, a number); the method
    checks the value itself."""
    kinds = typing.get_args(kind) or (kind,)
    if int in kinds:
        return where.int_(value, key, 0)
    if float in kinds:
        return where.num(value, key)
    return value
