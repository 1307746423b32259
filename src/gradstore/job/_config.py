"""The job file (TOML): parsed strictly, unknown keys are errors, defaults named here.

job = "digits"
coordinator = "did:key:z6Mk..."
peers = ["did:key:z6Mk...", ...]
[aggregation]   method, weights = {did = w}, the method's own parameters (trim_ratio,
                byzantine, select: its class's fields), clip_input_norm, clip_output_norm
[rounds]        count (0 = until stopped), quorum, deadline_s, max_ahead
[limits]        max_gradient_bytes, max_tensors, max_elements
[messages]      max_clock_skew_s (messages stamped further from now are refused)
[inputs]        require_bound_meta (refuse documents whose meta names no peer, round, job)
[[schema]]      optional: name, dtype, shape of every expected tensor
"""

from __future__ import annotations

import math
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from ..aggregate import CLIP_PARAMETERS, AggregationParams, parameter_names
from ..aggregate.methods import REGISTRY, MethodName, method_class
from ..errors import AggregationError, ConfigError
from ..format import DTYPES, Limits
from ..messages import Roster, public_key_from_did
from ..messages.schema import JOB_NAME

DEFAULT_DEADLINE_S = 60.0
DEFAULT_MAX_AHEAD = 1  # announcements for the next round are buffered, later ones refused
DEFAULT_MAX_CLOCK_SKEW_S = 120.0


@dataclass(frozen=True)
class RoundsConfig:
    """How many rounds, how many verified peers close one at its deadline, and when."""

    count: int = 1
    quorum: int = 1
    deadline_s: float = DEFAULT_DEADLINE_S
    max_ahead: int = DEFAULT_MAX_AHEAD


@dataclass(frozen=True)
class MessagesConfig:
    """How far a message's ``sent_at`` may be from the receiver's clock before it is refused."""

    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S


@dataclass(frozen=True)
class InputsConfig:
    """What an input's document must say of itself: with ``require_bound_meta``, its meta
    must name its peer, round and job (``coordinator.binding``); without, only the keys it
    has are checked."""

    require_bound_meta: bool = False


@dataclass(frozen=True)
class TensorSpec:
    """One expected tensor of every gradient in the job."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class JobConfig:
    """A parsed, validated job file."""

    job: str
    coordinator: str
    peers: tuple[str, ...]
    method: MethodName = "fedavg"
    weights: Mapping[str, float] = field(default_factory=dict)  # per peer, for "weighted"
    #: The method's own parameters by name (``{"trim_ratio": 0.2}``): its class's fields.
    method_params: Mapping[str, Any] = field(default_factory=dict)
    clip_input_norm: float | None = None
    clip_output_norm: float | None = None
    rounds: RoundsConfig = field(default_factory=RoundsConfig)
    limits: Limits = field(default_factory=Limits)
    schema: tuple[TensorSpec, ...] | None = None
    messages: MessagesConfig = field(default_factory=MessagesConfig)
    inputs: InputsConfig = field(default_factory=InputsConfig)

    def params_for(self, peers: Sequence[str]) -> AggregationParams:
        """Aggregation parameters for inputs from ``peers`` (in that order): the method sets
        itself up from the job (``Method.for_round``)."""
        strategy = method_class(self.method).for_round(self.method_params, self.weights, peers)
        return AggregationParams(
            self.method,
            strategy=strategy,
            clip_input_norm=self.clip_input_norm,
            clip_output_norm=self.clip_output_norm,
        )

    @cached_property
    def roster(self) -> Roster:
        """The job's peers sorted by did: the order of every peer bitmap in its messages."""
        return Roster(self.peers)

    @property
    def gradients_topic(self) -> str:
        return topics(self.job)[0]

    @property
    def results_topic(self) -> str:
        return topics(self.job)[1]


def topics(job: str) -> tuple[str, str]:
    """The pubsub topics of a job: (gradients, results)."""
    return f"gradstore/v1/{job}/gradients", f"gradstore/v1/{job}/results"


def load_job(path: str | Path) -> JobConfig:
    """Read and validate a job file; every problem is a ``ConfigError`` naming the key."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
    return parse_job(raw, source=str(path))


def parse_job(raw: Mapping[str, Any], source: str = "job") -> JobConfig:
    """Validate a job mapping (as loaded from TOML)."""
    where = _Where(source)
    where.keys(
        raw,
        {
            "job",
            "coordinator",
            "peers",
            "aggregation",
            "rounds",
            "limits",
            "schema",
            "messages",
            "inputs",
        },
        "",
    )
    job = where.req(raw, "job", str, "")
    if not JOB_NAME.fullmatch(job):
        raise where.err("job", "must be 1-64 of A-Z a-z 0-9 . _ - (it is part of the pubsub topic)")
    coordinator = where.did(where.req(raw, "coordinator", str, ""), "coordinator")
    peers_raw = where.req(raw, "peers", list, "")
    peers = tuple(where.did(p, f"peers[{i}]") for i, p in enumerate(peers_raw))
    if not peers:
        raise where.err("peers", "lists no peer")
    if len(set(peers)) != len(peers):
        raise where.err("peers", "lists a peer twice")

    agg = raw.get("aggregation", {})
    names = parameter_names()
    types = _method_types()
    where.keys(agg, {"method", *names}, "aggregation.")
    method = agg.get("method", "fedavg")
    if method not in REGISTRY:
        raise where.err(
            "aggregation.method", f"unknown method {method!r} (one of {', '.join(REGISTRY)})"
        )
    weights_raw = agg.get("weights", {})
    where.keys(
        weights_raw,
        set(weights_raw) if isinstance(weights_raw, Mapping) else set(),
        "aggregation.weights.",
    )
    weights = {str(k): where.num(v, f"aggregation.weights.{k}") for k, v in weights_raw.items()}
    negative = [k for k, w in weights.items() if w < 0]
    if negative:
        raise where.err(f"aggregation.weights.{negative[0]}", "must be >= 0")
    if weights and method != "weighted":
        raise where.err("aggregation.weights", f"does not apply to method {method!r}")
    if method == "weighted":
        missing = [p for p in peers if p not in weights]
        if missing:
            raise where.err(
                "aggregation.weights",
                f"method 'weighted' needs a weight for every peer; missing {missing[0]}",
            )
    unknown = [p for p in weights if p not in peers]
    if unknown:
        raise where.err("aggregation.weights", f"weight for a peer not in peers: {unknown[0]}")

    rounds_raw = raw.get("rounds", {})
    where.keys(rounds_raw, {"count", "quorum", "deadline_s", "max_ahead"}, "rounds.")
    rounds = RoundsConfig(
        count=where.int_(rounds_raw.get("count", 1), "rounds.count", 0),
        quorum=where.int_(rounds_raw.get("quorum", len(peers)), "rounds.quorum", 1),
        deadline_s=where.num(
            rounds_raw.get("deadline_s", DEFAULT_DEADLINE_S), "rounds.deadline_s", positive=True
        ),
        max_ahead=where.int_(rounds_raw.get("max_ahead", DEFAULT_MAX_AHEAD), "rounds.max_ahead", 0),
    )
    if rounds.quorum > len(peers):
        raise where.err(
            "rounds.quorum", f"{rounds.quorum} is more than the {len(peers)} peers listed"
        )

    limits_raw = raw.get("limits", {})
    where.keys(limits_raw, {"max_gradient_bytes", "max_tensors", "max_elements"}, "limits.")
    base = Limits()
    limits = Limits(
        max_bytes=where.int_(
            limits_raw.get("max_gradient_bytes", base.max_bytes), "limits.max_gradient_bytes", 1
        ),
        max_tensors=where.int_(
            limits_raw.get("max_tensors", base.max_tensors), "limits.max_tensors", 1
        ),
        max_rank=base.max_rank,
        max_elements=where.int_(
            limits_raw.get("max_elements", base.max_elements), "limits.max_elements", 1
        ),
        max_meta_bytes=base.max_meta_bytes,
        max_name_bytes=base.max_name_bytes,
    )

    messages_raw = raw.get("messages", {})
    where.keys(messages_raw, {"max_clock_skew_s"}, "messages.")
    messages = MessagesConfig(
        max_clock_skew_s=where.num(
            messages_raw.get("max_clock_skew_s", DEFAULT_MAX_CLOCK_SKEW_S),
            "messages.max_clock_skew_s",
            positive=True,
        )
    )

    inputs_raw = raw.get("inputs", {})
    where.keys(inputs_raw, {"require_bound_meta"}, "inputs.")
    inputs = InputsConfig(
        require_bound_meta=where.bool_(
            inputs_raw.get("require_bound_meta", False), "inputs.require_bound_meta"
        )
    )

    schema = None
    if "schema" in raw:
        specs: list[TensorSpec] = []
        for i, item in enumerate(where.req(raw, "schema", list, "")):
            where.keys(item, {"name", "dtype", "shape"}, f"schema[{i}].")
            dtype = where.req(item, "dtype", str, f"schema[{i}].")
            if dtype not in DTYPES:
                raise where.err(
                    f"schema[{i}].dtype", f"unknown dtype {dtype!r}; allowed: {' '.join(DTYPES)}"
                )
            shape = tuple(
                where.int_(d, f"schema[{i}].shape", 0)
                for d in where.req(item, "shape", list, f"schema[{i}].")
            )
            name = where.req(item, "name", str, f"schema[{i}].")
            if not name:
                raise where.err(f"schema[{i}].name", "must not be empty")
            if any(s.name == name for s in specs):
                raise where.err(f"schema[{i}].name", f"{name!r} is listed twice")
            specs.append(TensorSpec(name, dtype, shape))
        schema = tuple(sorted(specs, key=lambda s: s.name.encode()))

    cfg = JobConfig(
        job=job,
        coordinator=coordinator,
        peers=peers,
        method=cast(MethodName, method),
        weights=weights,
        method_params={
            key: _method_param(agg[key], types[key], f"aggregation.{key}", where)
            for key in names
            if key in types and key in agg
        },
        clip_input_norm=_opt(agg, "clip_input_norm", where),
        clip_output_norm=_opt(agg, "clip_output_norm", where),
        rounds=rounds,
        limits=limits,
        schema=schema,
        messages=messages,
        inputs=inputs,
    )
    given = {**cfg.method_params, **{k: getattr(cfg, k) for k in CLIP_PARAMETERS}}
    for key in names:
        if key in agg and key in given:  # each on its own first, so the error names its key
            try:
                AggregationParams(method, **{key: given[key]})
            except AggregationError as exc:
                raise where.err(f"aggregation.{key}", str(exc)) from exc
    # The checks the aggregator applies, early, for the smallest round the quorum allows: any
    # `quorum` peers (for `weighted`, the heaviest ones: weights are per peer, not per slot).
    smallest = sorted(peers, key=lambda p: -weights.get(p, 0.0))[: rounds.quorum]
    try:
        cfg.params_for(smallest).validate(rounds.quorum)
    except AggregationError as exc:
        raise ConfigError(
            f"{source}: [aggregation] cannot work with quorum {rounds.quorum}: {exc}"
        ) from exc
    # and for the largest one, every peer: krum and multikrum take at most MAX_KRUM_INPUTS
    try:
        cfg.params_for(list(peers)).validate(len(peers))
    except AggregationError as exc:
        raise where.err(
            "peers", f"lists {len(peers)} peers, too many for [aggregation]: {exc}"
        ) from exc
    return cfg


def _method_types() -> dict[str, Any]:
    """The methods' own parameters (not ``weights``: a table by peer), with their types."""
    return {
        name: kind
        for cls in REGISTRY.values()
        for name, kind in cls.parameter_types().items()
        if name != "weights"
    }


def _method_param(value: Any, kind: Any, key: str, where: _Where) -> Any:
    """A method parameter read as its class declares it (an int, a number); the method
    checks the value itself."""
    kinds = typing.get_args(kind) or (kind,)
    if int in kinds:
        return where.int_(value, key, 0)
    if float in kinds:
        return where.num(value, key)
    return value


def _opt(table: Mapping[str, Any], key: str, where: _Where) -> float | None:
    return None if key not in table else where.num(table[key], f"aggregation.{key}")


class _Where:
    """Builds errors that name the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def err(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: `{key}` {message}")

    def keys(self, table: Any, allowed: set[str], prefix: str) -> None:
        if not isinstance(table, Mapping):
            raise self.err(prefix.rstrip(".") or "(top)", "must be a table")
        extra = sorted(set(table) - allowed)
        if extra:
            raise self.err(
                prefix + extra[0], f"is not a known key (known: {', '.join(sorted(allowed))})"
            )

    def req(self, table: Mapping[str, Any], key: str, kind: type, prefix: str) -> Any:
        if key not in table:
            raise self.err(prefix + key, "is required")
        value = table[key]
        if not isinstance(value, kind):
            raise self.err(prefix + key, f"must be a {kind.__name__}, got {type(value).__name__}")
        return value

    def did(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.err(key, "must be a did:key string")
        try:
            public_key_from_did(value)
        except ValueError as exc:
            raise self.err(key, f"is not a valid Ed25519 did:key ({exc})") from exc
        return value

    def num(self, value: Any, key: str, positive: bool = False) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise self.err(key, "must be a finite number")
        if positive and value <= 0:
            raise self.err(key, "must be > 0")
        return float(value)

    def bool_(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.err(key, "must be true or false")
        return value

    def int_(self, value: Any, key: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.err(key, "must be an integer")
        if value < minimum:
            raise self.err(key, f"must be >= {minimum}")
        return value
