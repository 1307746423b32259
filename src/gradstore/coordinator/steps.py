"""A job's steps as the coordinator runs them, named as on the wire: pure, no I/O.

A stepped job (``[[steps]]``) runs each step of a round as a round of its own: its peers,
its book, its deadline and quorum, its method. A job without steps runs its one implicit
step, whose name on the wire and in the coordinator's keys is None, so everything it
writes is what it wrote before steps existed. ``Key`` is an input's key: ``(round, peer)``
in a job without steps, ``(round, peer, step)`` in a stepped job.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ..job import JobConfig, StepConfig
from .fetch_plan import Key
from .rounds import RoundBook, Schema

__all__ = ["ByRound", "JobSteps", "Key", "RoundBooks", "StepName", "input_key", "key_step"]

#: A step's name on the wire: None is the one step of a job without steps.
StepName = str | None
#: One round's books, by step, in the job's (backward) order.
RoundBooks = dict[StepName, RoundBook]


def input_key(round_: int, peer: str, step: StepName) -> Key:
    """The key of ``peer``'s input to ``step`` of ``round_``."""
    return (round_, peer) if step is None else (round_, peer, step)


def key_step(key: Key) -> StepName:
    """The step of an input's key (None: the job has no steps)."""
    return key[2] if len(key) == 3 else None


class JobSteps:
    """The job's steps by wire name, in the job's (backward) order: each one's config, rank
    (0 first: fetches go to the first step in backward order), peers and configured schema.

    In a job split among coordinators (docs/design/multicoord.md), ``owner`` (a
    coordinator's did) keeps only the steps it owns in ``configs`` (those it runs);
    ``others`` maps each other step to its owner, and ``order`` lists every step of the job.
    The root (the job's coordinator) waits on every step to end a round (``ends``), any
    other owner on its own."""

    def __init__(self, config: JobConfig, owner: str | None = None) -> None:
        self.stepped = config.stepped
        owner = config.coordinator if owner is None else owner
        self.root = owner == config.coordinator
        names: list[StepName] = [s.name for s in config.steps] if self.stepped else [None]
        self.order: tuple[StepName, ...] = tuple(names)
        self.others: dict[str, str] = {
            s.name: config.owner(s)
            for s in config.steps
            if self.stepped and config.owner(s) != owner
        }
        self.all_peers: dict[str, frozenset[str]] = {
            s.name: frozenset(s.peers) for s in config.steps if self.stepped
        }
        self.configs: dict[StepName, StepConfig] = {
            name: step
            for name, step in zip(names, config.steps, strict=True)
            if name not in self.others
        }
        self.rank: dict[StepName, int] = {name: i for i, name in enumerate(names)}
        self.peers: dict[StepName, frozenset[str]] = {
            name: frozenset(step.peers) for name, step in self.configs.items()
        }
        self.configured: dict[StepName, Schema] | None = None
        if config.schema is not None:
            self.configured = {
                name: tuple(
                    (t.name, t.dtype, t.shape) for t in config.schema if step.covers(t.name)
                )
                for name, step in self.configs.items()
            }

    def __iter__(self) -> Iterator[StepName]:
        return iter(self.configs)

    def __len__(self) -> int:
        return len(self.configs)

    def __getitem__(self, name: StepName) -> StepConfig:
        return self.configs[name]

    @property
    def ends(self) -> tuple[StepName, ...]:
        """The steps whose end ends a round here: every step at the root, else its own."""
        return self.order if self.root else tuple(self.configs)

    @property
    def admission(self) -> Mapping[str, frozenset[str]] | None:
        """Each step's peers for ``admission.admit`` (None: the job has no steps): every
        step of the job, so a step the job lacks is told as such whoever hears it."""
        if not self.stepped:
            return None
        return self.all_peers

    def books(self, round_: int, opened_at: float) -> RoundBooks:
        """Fresh books for every step of ``round_``."""
        return {
            name: RoundBook(round_, step.peers, opened_at, step=name)
            for name, step in self.configs.items()
        }


class ByRound(Mapping[int, RoundBook]):
    """The books of one step by round, a live view over ``{round: {step: book}}`` (for a
    job without steps: its books, as the coordinator kept them before steps existed)."""

    def __init__(self, rounds: Mapping[int, RoundBooks], step: StepName = None) -> None:
        self._rounds = rounds
        self._step = step

    def __getitem__(self, round_: int) -> RoundBook:
        books = self._rounds[round_]
        if self._step not in books:
            raise KeyError(round_)
        return books[self._step]

    def __iter__(self) -> Iterator[int]:
        return (r for r, books in self._rounds.items() if self._step in books)

    def __len__(self) -> int:
        return sum(1 for _ in self)
