"""Command handlers and argparse choices that import their module only when used.

``gradstore --help`` and ``--version`` build every parser; with these, that
imports neither NumPy nor httpx (nor the layers that need them).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence

Command = Callable[[argparse.Namespace], int]

_HTTPX_CLI = "httpx._main"


def lazy(module: str, name: str, *, blas: bool = True) -> Command:
    """The command ``name`` of ``gradstore.cli.<module>``, imported when it runs.

    ``blas=False``: the command does no linear algebra, so NumPy's OpenBLAS starts with
    one thread instead of one per core (unless ``OPENBLAS_NUM_THREADS`` is set): its
    thread pool is started when NumPy is imported, costs 10-30 ms of every start on two
    cores (more on big machines), and such a command never uses it.

    Every command also goes without httpx's own command line (``httpx._main``), which
    ``import httpx`` loads whenever ``click`` and ``rich`` are installed (Flower brings
    both): 35-40 ms of every node command's start, for a module no command uses.
    httpx falls back to a stub ``httpx.main`` when it cannot be imported.
    """

    def run(args: argparse.Namespace) -> int:
        if not blas:
            one_blas_thread()
        if "httpx" not in sys.modules:
            sys.modules.setdefault(_HTTPX_CLI, None)  # type: ignore[arg-type]
        command: Command = getattr(importlib.import_module(f"{__package__}.{module}"), name)
        return command(args)

    run.__name__ = run.__qualname__ = name
    return run


def one_blas_thread() -> None:
    """Start NumPy's OpenBLAS with one thread when NumPy is imported from now on (unless
    ``OPENBLAS_NUM_THREADS`` is set): for what does no linear algebra (see ``lazy``)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


class LazyChoices(Sequence[str]):
    """argparse ``choices`` loaded on first use (a check, an error or a help text)."""

    def __init__(self, load: Callable[[], Sequence[str]]) -> None:
        self._load = load
        self._choices: Sequence[str] | None = None

    def _get(self) -> Sequence[str]:
        if self._choices is None:
            self._choices = tuple(self._load())
        return self._choices

    def __contains__(self, value: object) -> bool:
        return value in self._get()

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        return self._get()[index]
