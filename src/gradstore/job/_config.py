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
[[steps]]       optional, output layer first (a backward pass): name (1-64 of A-Z a-z 0-9 . _ -),
                tensors (exact names or `prefix.*`), peers (default: all), quorum (default:
                min(rounds.quorum, its peers)), deadline_s (default: rounds'), and any
                [aggregation] key as an override (another method drops the job's method
                parameters and weights, keeps its clipping). Every tensor is in one step: an
                overlap is refused, and with [[schema]] so is a tensor in no step or a selector
                matching none. Without [[steps]], one step "all" covers every tensor.
                coordinator (default: the job's): the did of the coordinator that owns the
                step (docs/design/multicoord.md); the job's coordinator is the root.
[population]    optional: population-based training over the peers (``_population``)
[[stages]]      optional: model-parallel (pipeline) training, each stage a step (``_pipeline``)
[pipeline]      optional with [[stages]]: micro_batches, in_flight, deadline_s
[[groups]]      optional: a tree by peer groups (docs/design/multicoord.md): name, coordinator
                (the group's leaf), peers (each job peer in exactly one group), quorum
                (default: min(rounds.quorum, its peers)); the job's coordinator is the root.
                A linear method with accumulate = "exact" only, no clipping, no [[steps]]
                (``_groups``).
[pinning]       optional: cluster (REST API URL), replication_min, replication_max, wait_s:
                what a round keeps is pinned through IPFS Cluster (``_pinning``)
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..aggregate import AggregationParams
from ..aggregate.methods import MethodName
from ..errors import ConfigError
from ..format import DTYPES, Limits
from ..messages import Roster, public_key_from_did
from ..messages.schema import JOB_NAME
from ._aggregation import Aggregation, aggregation_keys, check_sizes, parse_aggregation
from ._groups import GroupConfig, parse_groups, tree_problem
from ._pinning import PinningConfig, parse_pinning
from ._pipeline import PipelineConfig, parse_pipeline, stages_as_steps
from ._population import PopulationConfig, parse_population
from ._steps import StepConfig, StepsPlan, implicit_step, parse_steps

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
    #: The round's steps, output layer first. Left empty (a job without ``[[steps]]``), it
    #: is one implicit step, ``DEFAULT_STEP``, of every tensor, with the job's peers,
    #: quorum, deadline and aggregation (and follows them in ``dataclasses.replace``).
    steps: tuple[StepConfig, ...] = ()
    #: Population-based training over the peers (``[population]``), or None.
    population: PopulationConfig | None = None
    #: Model-parallel training (``[[stages]]``, ``[pipeline]``), or None.
    pipeline: PipelineConfig | None = None
    #: Pin what rounds keep through IPFS Cluster (``[pinning]``), or None: the node alone.
    pinning: PinningConfig | None = None
    #: A tree by peer groups (``[[groups]]``): each group's leaf, its peers; () for none.
    groups: tuple[GroupConfig, ...] = ()
    #: In one group's view of a tree job (``group_view``): the group's name, else None.
    group: str | None = None
    #: In one group's view of a tree job: the tree's root (the job file's coordinator).
    root: str | None = None

    def __post_init__(self) -> None:
        if not self.steps or (len(self.steps) == 1 and self.steps[0].covers_all):
            step = implicit_step(
                self.peers, self.rounds.quorum, self.rounds.deadline_s, self.aggregation
            )
            object.__setattr__(self, "steps", (step,))

    @property
    def stepped(self) -> bool:
        """Whether the job file lists ``[[steps]]`` (else its one step covers every tensor)."""
        return not self.steps[0].covers_all

    @property
    def coordinators(self) -> tuple[str, ...]:
        """Every coordinator that owns a step: the job's (the root) first, then the others
        in the order their first step is listed. One, for a job not split among several."""
        found = [self.coordinator, *(g.coordinator for g in self.groups)]
        for step in self.steps:
            if step.coordinator is not None and step.coordinator not in found:
                found.append(step.coordinator)
        return tuple(found)

    def owner(self, step: StepConfig) -> str:
        """The did of the coordinator that owns ``step`` (the job's unless it names another)."""
        return self.coordinator if step.coordinator is None else step.coordinator

    @cached_property
    def step_owners(self) -> dict[str, str]:
        """Each step another coordinator than the job's owns, with its owner's did: whom
        its statuses and results must be signed by (``messages.verify_message(owners=)``)."""
        return {s.name: self.owner(s) for s in self.steps if self.owner(s) != self.coordinator}

    def steps_of(self, coordinator: str) -> tuple[StepConfig, ...]:
        """The steps ``coordinator`` owns, in the job's order."""
        return tuple(s for s in self.steps if self.owner(s) == coordinator)

    @property
    def aggregation(self) -> Aggregation:
        """The job's ``[aggregation]``: what a step aggregates with unless it overrides it."""
        return Aggregation(
            self.method,
            self.weights,
            self.method_params,
            self.clip_input_norm,
            self.clip_output_norm,
        )

    @cached_property
    def plan(self) -> StepsPlan:
        """The steps as a lookup: ``plan.step_of(name)``, ``plan.partition(names)``."""
        return StepsPlan(self.steps)

    def params_for(self, peers: Sequence[str]) -> AggregationParams:
        """Aggregation parameters for inputs from ``peers`` (in that order): the method sets
        itself up from the job (``Method.for_round``)."""
        return self.aggregation.params_for(peers)

    @cached_property
    def roster(self) -> Roster:
        """The job's peers sorted by did: the order of every peer bitmap in its messages."""
        return Roster(self.peers)

    @property
    def gradients_topic(self) -> str:
        return topics(self.job, self.group)[0]

    @property
    def results_topic(self) -> str:
        return topics(self.job, self.group)[1]

    @property
    def tree(self) -> bool:
        """Whether the job is a tree by peer groups (``[[groups]]``), seen whole."""
        return bool(self.groups)

    def group_of(self, peer: str) -> GroupConfig:
        """The group ``peer`` is in (KeyError: none, or the job has no groups)."""
        for g in self.groups:
            if peer in g.peers:
                return g
        raise KeyError(peer)

    def group_led_by(self, did: str) -> GroupConfig | None:
        """The group whose leaf coordinator is ``did`` (None: no group's)."""
        return next((g for g in self.groups if g.coordinator == did), None)

    def group_view(self, name: str) -> JobConfig:
        """Group ``name`` of a tree job as a job of its own: what its leaf coordinator runs
        and its peers use. Its coordinator is the leaf, its peers (and roster) the group's,
        its topics the group's (``topics(job, group)``), its quorum the group's; ``root``
        names the tree's root, whose signed result is the round's."""
        g = next((g for g in self.groups if g.name == name), None)
        if g is None:
            raise ConfigError(f"job {self.job!r} has no group {name!r}")
        return dataclasses.replace(
            self,
            coordinator=g.coordinator,
            peers=g.peers,
            rounds=dataclasses.replace(self.rounds, quorum=g.quorum),
            steps=(),
            groups=(),
            group=g.name,
            root=self.coordinator,
        )


def topics(job: str, group: str | None = None) -> tuple[str, str]:
    """The pubsub topics of a job: (gradients, results); a tree job's group has its own
    (its peers announce to its leaf and hear it there, and the root's result)."""
    base = f"gradstore/v1/{job}" if group is None else f"gradstore/v1/{job}/group/{group}"
    return f"{base}/gradients", f"{base}/results"


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
            "steps",
            "population",
            "stages",
            "pipeline",
            "pinning",
            "groups",
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
    where.keys(agg, aggregation_keys(), "aggregation.")
    aggregation = parse_aggregation(agg, where, "aggregation.", peers)

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

    check_sizes(aggregation, where, "aggregation", "peers", peers, rounds.quorum, "[aggregation]")
    steps: tuple[StepConfig, ...] = ()
    steps_raw = raw.get("steps")
    if "stages" in raw:
        if "steps" in raw:
            raise where.err("steps", "is written by [[stages]]: give one or the other")
        steps_raw = stages_as_steps(raw["stages"], where)
    elif "pipeline" in raw:
        raise where.err("pipeline", "needs [[stages]]")
    if steps_raw is not None:
        steps = parse_steps(
            steps_raw,
            where,
            peers=peers,
            quorum=rounds.quorum,
            deadline_s=rounds.deadline_s,
            aggregation=aggregation,
            max_name_bytes=limits.max_name_bytes,
            schema=None if schema is None else [s.name for s in schema],
            # [[stages]] are the steps in reverse: errors name the user's stages[i]
            label=None if "stages" not in raw else (lambda i: f"stages[{len(steps_raw) - 1 - i}]"),
        )
    pipeline = None
    if "stages" in raw:
        assert steps_raw is not None
        pipeline = parse_pipeline(
            list(reversed(steps_raw)), raw.get("pipeline", {}), where, deadline_s=rounds.deadline_s
        )
    population = None
    if "population" in raw:
        population = parse_population(
            raw["population"], where, peers=peers, deadline_s=rounds.deadline_s
        )
    pinning = None if "pinning" not in raw else parse_pinning(raw["pinning"], where)
    steps = _owned(steps, coordinator, where, raw)
    groups: tuple[GroupConfig, ...] = ()
    if "groups" in raw:
        problem = tree_problem(aggregation, raw)
        if problem is not None:
            raise where.err(*problem)
        groups = parse_groups(
            raw["groups"], where, root=coordinator, peers=peers, quorum=rounds.quorum
        )
    return JobConfig(
        job=job,
        coordinator=coordinator,
        peers=peers,
        method=aggregation.method,
        weights=aggregation.weights,
        method_params=aggregation.method_params,
        clip_input_norm=aggregation.clip_input_norm,
        clip_output_norm=aggregation.clip_output_norm,
        rounds=rounds,
        limits=limits,
        schema=schema,
        messages=messages,
        inputs=inputs,
        steps=steps,
        population=population,
        pipeline=pipeline,
        pinning=pinning,
        groups=groups,
    )


def _owned(
    steps: tuple[StepConfig, ...], root: str, where: _Where, raw: Mapping[str, Any]
) -> tuple[StepConfig, ...]:
    """``steps`` with an owner equal to the job's coordinator written as None (the job is
    split only if a step names another); refuses a split in a job whose runner (pipeline,
    population) does not split rounds."""
    steps = tuple(
        dataclasses.replace(s, coordinator=None) if s.coordinator == root else s for s in steps
    )
    other = next((i for i, s in enumerate(steps) if s.coordinator is not None), None)
    if other is not None:
        for section in ("stages", "population"):
            if section in raw:
                key = "stages" if section == "stages" else f"steps[{other}].coordinator"
                raise where.err(
                    key,
                    f"a step names another coordinator than the job's, which a job with "
                    f"[{section}] cannot have: its rounds are not split among coordinators",
                )
    return steps


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
