"""A job's steps handed out during ``loss.backward()``, each as soon as autograd has
accumulated every one of its parameters' gradients (post-accumulate-grad hooks).

The output layer's step can be put and announced while backward still runs through the
earlier layers::

    with StepStream(model, cfg.plan) as stream:
        for x, y in batches:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()    # steps arrive on stream.get() as they complete
            stream.finish()                    # the rest: steps with parameters that got no grad

Gradient accumulation: ``stream.new_pass(final=False)`` before the micro-batches that only
accumulate, ``stream.new_pass()`` before the last one; only the last pass hands out steps.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.hooks import RemovableHandle

from ..errors import GradstoreError
from ..job import StepConfig, StepsPlan
from ._params import Parameters, named_parameters


class StepStreamError(GradstoreError, RuntimeError):
    """A StepStream used out of order: a second backward in one pass, ``finish()`` after an
    accumulating pass, ``new_pass()`` while a pass is under way, or the stream not open."""


@dataclass(frozen=True)
class ReadyStep:
    """One step's gradients after a backward pass: ``grads`` maps each of its parameters'
    names (sorted by UTF-8 bytes, as in a gradient) to its ``.grad``, shared (not copied)
    unless the stream copies; ``unused`` names those that got no gradient in the pass
    (handed out as their ``.grad`` from earlier passes, else as zeros)."""

    name: str
    grads: dict[str, torch.Tensor]
    unused: tuple[str, ...] = ()


class StepStream:
    """Registers a post-accumulate-grad hook on every trainable parameter of ``model`` and
    hands out each step of ``steps`` once all its parameters have their gradient for the pass.

    Steps go to ``on_ready`` if given, called in autograd's thread (keep it short: hand the
    step to another thread; an exception it raises comes out of ``backward()``), else to a
    queue read by ``get()`` and ``ready()``. Handed-out tensors are the parameters' ``.grad``
    themselves: the next backward, ``zero_grad(set_to_none=False)`` or an in-place clip
    changes them, so finish with a step before that, or pass ``copy=True`` (one clone per
    gradient, made in the hook). Use it as a context manager: leaving removes the hooks.
    """

    def __init__(
        self,
        model: Parameters,
        steps: StepsPlan | Sequence[StepConfig],
        *,
        on_ready: Callable[[ReadyStep], None] | None = None,
        copy: bool = False,
    ) -> None:
        self.plan = steps if isinstance(steps, StepsPlan) else StepsPlan(steps)
        self._params = named_parameters(model)
        parts = self.plan.partition(self._params)  # UncoveredTensorError for a name in no step
        empty = [step for step, names in parts.items() if not names]
        if empty:
            raise ValueError(
                f"step {empty[0]!r} covers none of the model's trainable parameters: "
                "this model cannot send it"
            )
        self._members = parts
        self._step_of = {name: step for step, names in parts.items() for name in names}
        self._on_ready = on_ready
        self._copy = copy
        self._queue: queue.SimpleQueue[ReadyStep] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._handles: list[RemovableHandle] = []
        self._final = True
        self._seen: set[str] = set()
        self._remaining: dict[str, int] = {}
        self._reset(final=True)

    def __enter__(self) -> StepStream:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        """Whether the hooks are registered."""
        return bool(self._handles)

    def open(self) -> None:
        """Register the hooks (all or none) and start a final pass."""
        if self._handles:
            return
        try:
            for name, p in self._params.items():
                hook = self._hook_for(name)
                self._handles.append(p.register_post_accumulate_grad_hook(hook))  # type: ignore[no-untyped-call]
        except BaseException:
            self.close()
            raise
        with self._lock:
            self._reset(final=True)

    def close(self) -> None:
        """Remove every hook; steps already handed out stay in the queue."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def new_pass(self, *, final: bool = True) -> None:
        """Start a backward pass: every step counts its parameters from none. ``final=False``:
        the backward calls until the next ``new_pass()`` only accumulate into ``.grad``
        (gradient accumulation's micro-batches) and hand out nothing."""
        with self._lock:
            self._check_open()
            if self._final and self._seen:
                raise StepStreamError(
                    "a pass is under way (some gradients have arrived): finish() it first"
                )
            self._reset(final=final)

    def finish(self) -> list[ReadyStep]:
        """After the final pass's backward: hand out (and return) every step still waiting,
        its parameters without a gradient in this pass listed as ``unused``; then start a
        new final pass. A step thus never waits for a parameter the loss did not use."""
        with self._lock:
            self._check_open()
            if not self._final:
                raise StepStreamError(
                    "finish() after an accumulating pass: call new_pass() before the last "
                    "micro-batch's backward"
                )
            waiting = [step for step, left in self._remaining.items() if left]
            flushed = [self._ready(step) for step in waiting]
            self._reset(final=True)
        for step in flushed:
            self._hand_out(step)
        return flushed

    def get(self, timeout: float | None = None) -> ReadyStep:
        """The next step handed out (without ``on_ready``), waiting up to ``timeout`` seconds
        (None: for ever); ``TimeoutError`` if none came."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no step became ready in {timeout} s") from None

    def ready(self) -> list[ReadyStep]:
        """Every step handed out and not yet taken, without waiting."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    # -- in autograd's thread -------------------------------------------------------------

    def _hook_for(self, name: str) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            self._arrived(name)

        return hook

    def _arrived(self, name: str) -> None:
        """Parameter ``name`` has its gradient for this backward: count it for its step."""
        with self._lock:
            if not self._final:
                return
            if name in self._seen:
                raise StepStreamError(
                    f"parameter {name!r} got a second gradient in one pass: call finish() "
                    "after each backward, or new_pass(final=False) before micro-batches "
                    "that only accumulate"
                )
            self._seen.add(name)
            step = self._step_of[name]
            self._remaining[step] -= 1
            done = self._ready(step) if self._remaining[step] == 0 else None
        if done is not None:
            self._hand_out(done)

    def _ready(self, step: str) -> ReadyStep:
        """Step ``step``'s gradients now (the lock held); parameters not seen are unused."""
        grads: dict[str, torch.Tensor] = {}
        unused = []
        for name in self._members[step]:
            p = self._params[name]
            grad = p.grad
            if name not in self._seen:
                unused.append(name)
                if grad is None:
                    grads[name] = torch.zeros_like(p)
                    continue
            if grad is None:  # a hook set it to None after accumulating
                raise StepStreamError(f"parameter {name!r} lost its .grad during backward")
            grads[name] = grad.detach().clone() if self._copy else grad
        self._remaining[step] = 0
        return ReadyStep(step, grads, tuple(unused))

    def _hand_out(self, step: ReadyStep) -> None:
        if self._on_ready is not None:
            self._on_ready(step)
        else:
            self._queue.put(step)

    def _reset(self, *, final: bool) -> None:
        self._final = final
        self._seen = set()
        self._remaining = {step: len(names) for step, names in self._members.items()}

    def _check_open(self) -> None:
        if not self._handles:
            raise StepStreamError("the StepStream is not open: use `with StepStream(...)`")
