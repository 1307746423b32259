"""A job's steps (``[[steps]]``): which tensors each covers, its peers, when it closes, how it
aggregates; and the mapping of tensor names to steps that the coordinator and peers share.

A step's ``tensors`` are exact names or ``prefix.*`` patterns (every name starting with
``prefix.``). No name may match two selectors, so every tensor belongs to at most one step;
with a ``[[schema]]``, to exactly one.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..aggregate import AggregationParams
from ..errors import ConfigError, MessageError, UncoveredTensorError
from ..format import name_problem
from ..messages.schema import JOB_NAME
from ..messages.step_record import PATTERN_SUFFIX, check_selector
from ._aggregation import Aggregation, Where, aggregation_keys, check_sizes, parse_aggregation

#: At most this many steps per job: a status lists every peer's state in every step, and at
#: 1,000 peers x 64 steps it still fits under the message size limit.
MAX_STEPS: Final = 64
#: The name of the one implicit step of a job without ``[[steps]]``: it covers every tensor.
DEFAULT_STEP: Final = "all"


@dataclass(frozen=True)
class Selector:
    """Tensor names a step takes: the name ``text`` exactly, or (``pattern``) every name
    starting with ``text`` (``a.*`` is the pattern ``a.``; the implicit step's is ``""``)."""

    text: str
    pattern: bool = False

    def matches(self, name: str) -> bool:
        """Whether ``name`` is one this selector takes."""
        return name.startswith(self.text) if self.pattern else name == self.text

    def __str__(self) -> str:
        return f"{self.text}*" if self.pattern else self.text


#: The implicit step's selector: every name (it cannot be written in a job file).
EVERYTHING: Final = Selector("", pattern=True)


@dataclass(frozen=True)
class StepConfig:
    """One step of a round: the tensors it covers, the peers that send them, its quorum and
    deadline, and how it aggregates (the job's ``[aggregation]`` unless it overrides it).
    ``coordinator``: the did of the coordinator that owns it (None: the job's own)."""

    name: str
    tensors: tuple[Selector, ...]
    peers: tuple[str, ...]
    quorum: int
    deadline_s: float
    aggregation: Aggregation
    coordinator: str | None = None

    @property
    def covers_all(self) -> bool:
        """Whether this is the implicit step of a job without ``[[steps]]``: every tensor."""
        return self.tensors == (EVERYTHING,)

    def covers(self, name: str) -> bool:
        """Whether tensor ``name`` belongs to this step."""
        return any(s.matches(name) for s in self.tensors)

    def params_for(self, peers: Sequence[str]) -> AggregationParams:
        """Aggregation parameters for this step's inputs from ``peers`` (in that order)."""
        return self.aggregation.params_for(peers)


class StepsPlan:
    """A job's steps as a lookup from tensor name to step; steps may not overlap (two
    selectors matching one name are refused with a ``ConfigError``)."""

    def __init__(self, steps: Sequence[StepConfig]) -> None:
        self.steps = tuple(steps)
        index = _Index(self.steps)
        if index.overlap is not None:
            (a, i), (b, j) = index.overlap
            raise ConfigError(
                f"steps overlap: {str(self.steps[b].tensors[j])!r} of step "
                f"{self.steps[b].name!r} and {str(self.steps[a].tensors[i])!r} of step "
                f"{self.steps[a].name!r}"
            )
        self._index = index

    def step_of(self, name: str) -> StepConfig | None:
        """The step tensor ``name`` belongs to, or None if no step covers it."""
        at = self._index.find(name)
        return None if at is None else self.steps[at[0]]

    def partition(self, names: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Every step's name (in the job's order) -> the tensor names of ``names`` it covers,
        sorted by UTF-8 bytes as in a gradient. ``UncoveredTensorError`` names the first
        tensor (in that order) that no step covers."""
        parts: dict[str, list[str]] = {step.name: [] for step in self.steps}
        for name in sorted(set(names), key=_utf8):
            step = self.step_of(name)
            if step is None:
                raise UncoveredTensorError(name)
            parts[step.name].append(name)
        return {step: tuple(found) for step, found in parts.items()}


def refuse_steps(cfg: Any, runner: str) -> None:
    """Refuse a job with ``[[steps]]`` in ``runner``, which does not run steps yet: running it
    as one round would silently ignore every step's peers and method."""
    if cfg.stepped:
        raise ConfigError(
            f"job {cfg.job!r} has [[steps]], which the job file accepts but {runner} does not "
            "run yet (issue 19: per-step rounds); remove [[steps]] to run it as one round"
        )


def implicit_step(
    peers: Sequence[str], quorum: int, deadline_s: float, aggregation: Aggregation
) -> StepConfig:
    """The one step of a job without ``[[steps]]``: every tensor, the job's peers, quorum,
    deadline and aggregation."""
    return StepConfig(DEFAULT_STEP, (EVERYTHING,), tuple(peers), quorum, deadline_s, aggregation)


def step_keys() -> set[str]:
    """The keys a ``[[steps]]`` table may hold."""
    return {
        "name",
        "tensors",
        "peers",
        "quorum",
        "deadline_s",
        "coordinator",
        *aggregation_keys(),
    }


def parse_steps(
    raw: Any,
    where: Where,
    *,
    peers: Sequence[str],
    quorum: int,
    deadline_s: float,
    aggregation: Aggregation,
    max_name_bytes: int,
    schema: Sequence[str] | None,
    label: Callable[[int], str] | None = None,
) -> tuple[StepConfig, ...]:
    """Read and check the ``[[steps]]`` tables over the job's ``peers``, ``quorum``,
    ``deadline_s`` and ``aggregation``; with a ``schema`` (its tensor names), every one of
    them must be in exactly one step and every selector must match one of them. ``label``
    names table ``i`` in errors (default ``steps[i]``; ``[[stages]]`` name their own)."""
    name_of = label or (lambda i: f"steps[{i}]")
    if not isinstance(raw, list):
        raise where.err("steps", "must be a list of tables ([[steps]])")
    if not raw:
        raise where.err("steps", "lists no step (leave it out for one step of every tensor)")
    if len(raw) > MAX_STEPS:
        raise where.err("steps", f"lists {len(raw)} steps, more than the {MAX_STEPS} allowed")
    steps: list[StepConfig] = []
    for i, table in enumerate(raw):
        step = _step(table, where, name_of(i), peers, quorum, deadline_s, aggregation)
        for j, selector in enumerate(step.tensors):
            _check_selector(selector, where, f"{name_of(i)}.tensors[{j}]", max_name_bytes)
        for k, other in enumerate(steps):
            if other.name == step.name:
                raise where.err(
                    f"{name_of(i)}.name", f"{step.name!r} is the name of {name_of(k)} too"
                )
        steps.append(step)
    index = _Index(steps)
    if index.overlap is not None:
        (a, i), (b, j) = index.overlap
        raise where.err(
            f"{name_of(b)}.tensors[{j}]",
            f"{str(steps[b].tensors[j])!r} (step {steps[b].name!r}) overlaps "
            f"{str(steps[a].tensors[i])!r} of step {steps[a].name!r} ({name_of(a)}.tensors[{i}]):"
            " a tensor belongs to one step",
        )
    if schema is not None:
        _check_schema(steps, index, schema, where, name_of)
    return tuple(steps)


def _step(
    table: Any,
    where: Where,
    key: str,
    job_peers: Sequence[str],
    job_quorum: int,
    job_deadline_s: float,
    job_aggregation: Aggregation,
) -> StepConfig:
    """One ``[[steps]]`` table, checked on its own (errors name ``key.x``)."""
    prefix = key + "."
    where.keys(table, step_keys(), prefix)
    name = table.get("name")
    if name is None:
        raise where.err(prefix + "name", "is required")
    if not isinstance(name, str) or not JOB_NAME.fullmatch(name):
        raise where.err(
            prefix + "name", "must be 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
        )
    tensors = table.get("tensors")
    if not isinstance(tensors, list) or not tensors:
        raise where.err(prefix + "tensors", "must be a non-empty list of names or `prefix.*`")
    selectors = tuple(_selector(t, where, f"{prefix}tensors[{j}]") for j, t in enumerate(tensors))
    peers = _peers(table.get("peers", list(job_peers)), where, prefix + "peers", job_peers)
    quorum = where.int_(
        table.get("quorum", min(job_quorum, len(peers))), prefix + "quorum", minimum=1
    )
    if quorum > len(peers):
        raise where.err(prefix + "quorum", f"{quorum} is more than the step's {len(peers)} peers")
    deadline_s = where.num(table.get("deadline_s", job_deadline_s), prefix + "deadline_s", True)
    aggregation = parse_aggregation(table, where, prefix, peers, job_aggregation)
    check_sizes(aggregation, where, key, prefix + "peers", peers, quorum, f"step {name!r}")
    owner = table.get("coordinator")
    if owner is not None:
        owner = where.did(owner, prefix + "coordinator")
    return StepConfig(name, selectors, peers, quorum, deadline_s, aggregation, owner)


def _selector(text: Any, where: Where, key: str) -> Selector:
    """An exact name, or ``prefix.*`` with a non-empty ``prefix``; no other ``*``: the rule a
    step record's selectors follow (``messages.check_selector``), so a job's steps always fit
    in its records."""
    try:
        check_selector(key, text)
    except MessageError as exc:
        detail = str(exc).split(": ", 1)[-1].removeprefix(f"`{key}` ")
        raise where.err(key, detail) from None
    if text.endswith(PATTERN_SUFFIX) and len(text) > len(PATTERN_SUFFIX):
        return Selector(text[:-1], pattern=True)
    return Selector(text)


def _check_selector(selector: Selector, where: Where, key: str, max_name_bytes: int) -> None:
    """A selector's text must be able to start (or be) a tensor name."""
    problem = name_problem(selector.text)
    if problem is not None:
        raise where.err(key, f"{str(selector)[:80]!r} {problem}")
    size = len(_utf8(selector.text))
    if size > max_name_bytes:
        raise where.err(key, f"is {size} bytes, over the tensor names' {max_name_bytes}")


def _peers(raw: Any, where: Where, key: str, job_peers: Sequence[str]) -> tuple[str, ...]:
    """A step's peers: some of the job's, each once, at least one."""
    if not isinstance(raw, list):
        raise where.err(key, "must be a list of the job's peers")
    known = set(job_peers)
    for j, peer in enumerate(raw):
        if not isinstance(peer, str) or peer not in known:
            raise where.err(f"{key}[{j}]", f"{str(peer)[:80]!r} is not one of the job's peers")
    if not raw:
        raise where.err(key, "lists no peer")
    if len(set(raw)) != len(raw):
        raise where.err(key, "lists a peer twice")
    return tuple(raw)


def _check_schema(
    steps: Sequence[StepConfig],
    index: _Index,
    schema: Sequence[str],
    where: Where,
    name_of: Callable[[int], str],
) -> None:
    """Every schema tensor is in a step, and every selector matches a schema tensor."""
    for name in sorted(schema, key=_utf8):
        if index.find(name) is None:
            raise where.err("steps", f"leave [[schema]] tensor {name!r} in no step")
    names = sorted(schema)
    for i, step in enumerate(steps):
        for j, selector in enumerate(step.tensors):
            at = bisect.bisect_left(names, selector.text)
            if at == len(names) or not selector.matches(names[at]):
                raise where.err(
                    f"{name_of(i)}.tensors[{j}]", f"{str(selector)!r} matches no [[schema]] tensor"
                )


def _utf8(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


class _Index:
    """Selectors by text, to find a name's step without trying every selector, and the
    first overlap of two selectors ((step, selector) of each), if any."""

    def __init__(self, steps: Sequence[StepConfig]) -> None:
        self.exact: dict[str, tuple[int, int]] = {}
        self.prefixes: dict[str, tuple[int, int]] = {}
        self.overlap: tuple[tuple[int, int], tuple[int, int]] | None = None
        for i, step in enumerate(steps):
            for j, selector in enumerate(step.tensors):
                table = self.prefixes if selector.pattern else self.exact
                if selector.text in table and self.overlap is None:
                    self.overlap = (table[selector.text], (i, j))
                table.setdefault(selector.text, (i, j))
        self._lengths = sorted({len(p) for p in self.prefixes})
        if self.overlap is None:
            self.overlap = self._nested()

    def find(self, name: str) -> tuple[int, int] | None:
        """(step, selector) of the selector matching ``name``: at most one once checked."""
        if name in self.exact:
            return self.exact[name]
        for n in self._lengths:  # only the patterns' own lengths: long names cost little
            if n > len(name):
                break
            at = self.prefixes.get(name[:n])
            if at is not None:
                return at
        return None

    def _nested(self) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """Two selectors where one pattern takes the other's names (``a.*`` and ``a.b`` or
        ``a.b.*``): in a sorted list, what starts with a prefix follows it."""
        keys = sorted(
            [(t, 0, at) for t, at in self.prefixes.items()]
            + [(t, 1, at) for t, at in self.exact.items()]
        )
        found: list[tuple[tuple[int, int], tuple[int, int]]] = []
        for k, (text, kind, at) in enumerate(keys):
            if kind == 0 and k + 1 < len(keys) and keys[k + 1][0].startswith(text):
                other = keys[k + 1][2]
                found.append((min(at, other), max(at, other)))
        return min(found, key=lambda pair: pair[1]) if found else None
