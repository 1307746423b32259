"""The demo's steps (``gradstore demo --steps``): each round is two steps, the output layer
("head", trained by the first half of the peers) and every other layer ("body", by all of
them), each closed, aggregated and published by the coordinator on its own.

A peer publishes its steps from one update (``Peer.publish_steps``) and takes every step's
aggregate as it closes (``Peer.step_results``): a model update needs every layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..dag import CID
from ..errors import CoordinatorError
from ..format import CompressedGradient, Gradient, encode
from ..peer import AggregateResult, Peer, StepFailed

HEAD: Final = "head"
BODY: Final = "body"


@dataclass(frozen=True)
class DemoStep:
    """One step of the demo's job: its name, the layers it covers (``fc2``: every tensor
    named ``fc2.*``) and the peers that train it (0-based party indexes)."""

    name: str
    layers: tuple[str, ...]
    peers: tuple[int, ...]

    @property
    def selectors(self) -> list[str]:
        """The step's ``tensors`` in the job file: one ``layer.*`` pattern per layer."""
        return [f"{layer}.*" for layer in self.layers]

    def describe(self) -> str:
        """``head = fc2.* by peers 1 2``: the step as the demo prints it (peers from 1)."""
        return (
            f"{self.name} = {', '.join(self.selectors)} by peers "
            f"{' '.join(str(i + 1) for i in self.peers)}"
        )


def layers(names: Iterable[str]) -> list[str]:
    """The layers of a model's tensor names, in the model's order: each name's part before
    its first ``.`` (``fc1.weight`` and ``fc1.bias`` are layer ``fc1``)."""
    return list(dict.fromkeys(name.split(".", 1)[0] for name in names))


def head_peers(peers: int) -> int:
    """How many peers train the head: half of them (at least one)."""
    return max(1, peers // 2)


def demo_steps(names: Sequence[str], peers: int) -> tuple[DemoStep, DemoStep]:
    """The head (the last layer, the first half of the peers) and the body (the other
    layers, every peer), output layer first as a backward pass makes them."""
    found = layers(names)
    if len(found) < 2:
        raise ValueError(
            f"--steps splits the model into its output layer and the rest; this one has one "
            f"layer ({', '.join(found)}): use --model mlp or cnn"
        )
    return (
        DemoStep(HEAD, (found[-1],), tuple(range(head_peers(peers)))),
        DemoStep(BODY, tuple(found[:-1]), tuple(range(peers))),
    )


def steps_tables(steps: Sequence[DemoStep], dids: Sequence[str]) -> list[dict[str, Any]]:
    """The job file's ``[[steps]]`` tables for ``steps`` over the peers ``dids``."""
    return [
        {"name": s.name, "tensors": s.selectors, "peers": [dids[i] for i in s.peers]} for s in steps
    ]


@dataclass(frozen=True)
class StepRow:
    """One step of a round as the peers saw it close: its peers (numbered from 1), the
    seconds from the round's start until the first peer held its aggregate, the
    aggregate's CID and the step's record."""

    round: int
    step: str
    peers: tuple[int, ...]
    seconds: float
    aggregate: CID
    record: CID


class StepWatch:
    """Reports each step of one round once, when the first peer holds its aggregate."""

    def __init__(
        self,
        round_: int,
        start: float,
        numbers: Mapping[str, int],
        on_step: Callable[[StepRow], None] | None,
    ) -> None:
        self.round = round_
        self.start = start
        self.numbers = numbers  # did -> peer number (from 1)
        self.on_step = on_step
        self.rows: dict[str, StepRow] = {}

    def seen(self, got: AggregateResult) -> None:
        """A peer holds ``got`` (a step's verified aggregate): report it if it is the first."""
        assert got.step is not None
        if got.step in self.rows:
            return
        row = StepRow(
            self.round,
            got.step,
            tuple(sorted(self.numbers[p] for p in got.peers)),
            time.perf_counter() - self.start,
            got.cid,
            got.record,
        )
        self.rows[got.step] = row
        if self.on_step is not None:
            self.on_step(row)


@dataclass(frozen=True)
class SteppedRound:
    """What one peer's stepped round gave it: every step's aggregate (merged into one
    gradient of the whole model), the steps' aggregate CIDs in closing order, and the bytes
    of the step documents it stored and fetched."""

    aggregate: Gradient
    steps: tuple[tuple[str, CID], ...]
    input_bytes: int
    aggregate_bytes: int


async def publish_steps(
    peer: Peer,
    update: Gradient | CompressedGradient,
    round_: int,
    num_samples: int,
    *,
    timeout: float,
    watch: StepWatch,
) -> SteppedRound:
    """Publish this peer's steps of ``update`` and gather every step's aggregate as it
    closes; ``CoordinatorError`` if a step failed (the model needs every layer)."""
    own = peer.steps.own()
    input_bytes = sum(encode(peer.prepare(update, round_, num_samples, step=s)).size for s in own)
    await peer.publish_steps(update, round_, num_samples, timeout=timeout)
    tensors: dict[str, Any] = {}
    steps: list[tuple[str, CID]] = []
    fetched = 0
    async for got in peer.step_results(round_, timeout=timeout + 30.0):
        if isinstance(got, StepFailed):
            raise CoordinatorError(f"round {round_} step {got.step} failed: {got.reason}")
        watch.seen(got)
        tensors.update(got.gradient.tensors)
        fetched += encode(got.gradient).size
        assert got.step is not None
        steps.append((got.step, got.cid))
    return SteppedRound(Gradient(tensors), tuple(steps), input_bytes, fetched)
