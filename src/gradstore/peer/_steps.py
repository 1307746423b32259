"""Which steps of a job a peer publishes, and a gradient cut down to one of them: no I/O.

A stepped job (``[[steps]]``) takes one document per step from each of the step's peers,
holding exactly that step's tensors. A peer may hold a whole gradient (a backward pass's
every tensor): cutting it keeps the step's tensors, the same array objects (no copy),
and drops those of the other steps. A tensor that no step covers, or a tensor the step
needs and the gradient lacks, is an error naming it, found before anything is sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

from ..errors import ConfigError, StepError
from ..format import CompressedGradient, Gradient
from ..job import JobConfig, StepConfig, StepsPlan

G = TypeVar("G", bound=Gradient | CompressedGradient)


class PeerSteps:
    """A job's steps as one peer (``did``; None: a listener without a key) sees them: the
    steps it may publish, and cutting. A did that is not the job's is a ``ConfigError``."""

    def __init__(self, config: JobConfig, did: str | None) -> None:
        if did is not None and did not in config.roster:
            raise ConfigError(f"{did} is not among the job's peers")
        self.config = config
        self.did = did
        self.plan: StepsPlan = config.plan
        self.names = tuple(s.name for s in config.steps)
        #: This peer's steps, in the job's (backward) order (none without a key).
        self.mine: tuple[StepConfig, ...] = tuple(
            s for s in config.steps if did is not None and did in s.peers
        )

    def check(self, step: str | None) -> str | None:
        """``step`` if this peer may publish to it, StepError otherwise: a stepped job needs
        one of the peer's steps, a job without steps none."""
        job = self.config.job
        if not self.config.stepped:
            if step is not None:
                raise StepError(f"job {job!r} has no [[steps]]: publish without a step", step)
            return None
        mine = ", ".join(repr(s.name) for s in self.mine) or "none"
        if step is None:
            raise StepError(
                f"job {job!r} is made of steps ({_listed(self.config)}): name the step "
                f"(this peer's: {mine}), or publish them all with publish_steps"
            )
        self.known(step)
        if all(s.name != step for s in self.mine):
            raise StepError(
                f"{self.did} is not among the peers of step {step!r} of job {job!r} "
                f"(this peer's steps: {mine})",
                step,
            )
        return step

    def known(self, step: str | None) -> str | None:
        """``step`` if the job has it (None: the round itself), StepError otherwise."""
        return known_step(self.config, step)

    def cut(self, gradient: G, step: str | None) -> G:
        """``gradient`` cut down to ``step``'s tensors (the same arrays); unchanged without
        a step. StepError names a tensor of the step it lacks; UncoveredTensorError a tensor
        that no step covers."""
        if step is None:
            return gradient
        (part,) = self.cut_steps(gradient, [step]).values()
        return part

    def cut_steps(self, gradient: G, steps: Sequence[str]) -> dict[str, G]:
        """``gradient`` cut into each of ``steps`` (in that order), every one checked first."""
        parts = self.plan.partition(gradient.tensors)
        out: dict[str, G] = {}
        for name in steps:
            step = next(s for s in self.config.steps if s.name == name)
            names = parts[name]
            self._complete(step, names)
            out[name] = _with_tensors(gradient, {n: gradient.tensors[n] for n in names})
        return out

    def own(self) -> list[str]:
        """This peer's steps by name, in the job's order; StepError when it is in none."""
        if not self.mine:
            raise StepError(f"{self.did} is among the peers of no step of job {self.config.job!r}")
        return [s.name for s in self.mine]

    def mine_of(self, gradient: G) -> G:
        """``gradient`` without the tensors of steps this peer is not in (the same arrays),
        each of its steps checked complete (a job without steps: ``gradient`` itself)."""
        if not self.config.stepped:
            return gradient
        parts = self.cut_steps(gradient, self.own())
        return _with_tensors(
            gradient, {n: a for part in parts.values() for n, a in part.tensors.items()}
        )

    def _complete(self, step: StepConfig, names: Sequence[str]) -> None:
        """StepError unless ``names`` (the gradient's tensors in ``step``) are all the step
        takes: with a [[schema]], its tensors of the step; without, one name per exact
        selector and at least one per ``prefix.*``."""
        have = set(names)
        schema = self.config.schema
        if schema is not None:
            wanted = [t.name for t in schema if step.covers(t.name)]
        else:
            wanted = [s.text for s in step.tensors if not s.pattern]
            for selector in step.tensors:
                if selector.pattern and not any(selector.matches(n) for n in names):
                    raise StepError(
                        f"the gradient has no tensor {str(selector)!r} of step {step.name!r}",
                        step.name,
                        str(selector),
                    )
        for name in wanted:
            if name not in have:
                raise StepError(
                    f"the gradient lacks tensor {name[:200]!r} of step {step.name!r}",
                    step.name,
                    name,
                )


def known_step(config: JobConfig, step: str | None) -> str | None:
    """``step`` if ``config``'s job has it (None: the round itself), StepError otherwise."""
    job = config.job
    if step is None:
        return None
    if not config.stepped:
        raise StepError(f"job {job!r} has no [[steps]], so no step {step!r}", step)
    if all(s.name != step for s in config.steps):
        raise StepError(f"job {job!r} has no step {step!r} (its steps: {_listed(config)})", step)
    return step


def _listed(config: JobConfig) -> str:
    return ", ".join(repr(s.name) for s in config.steps)


def _with_tensors(gradient: G, tensors: dict[str, Any]) -> G:
    """``gradient`` holding ``tensors`` (the same array objects: nothing is copied)."""
    changes: dict[str, Any] = {"tensors": tensors}
    return dataclasses.replace(gradient, **changes)
