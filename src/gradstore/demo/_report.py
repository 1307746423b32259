"""What the demo shows: a per-round table, a progress line, a plot and a summary JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from ._run import DemoResult, RoundRow
from ._steps import StepRow

_HEADER = (
    f"{'round':>5}  {'loss':>8}  {'accuracy':>8}  {'aggregate':<59}  {'inputs':>9}  "
    f"{'traffic':>9}  {'seconds':>7}"
)


def format_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 kB"`` (decimal units, like Kubo's ``ipfs stats``)."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def table_header() -> str:
    """The column titles of the per-round table: accuracy on the held-out set, ``inputs``
    and ``traffic`` as ``RoundRow.input_bytes`` and ``traffic_bytes`` count them."""
    return _HEADER


def format_row(row: RoundRow) -> str:
    """One table line; ``round`` is the round number in the job's records (from 0)."""
    return (
        f"{row.round:>5}  {row.loss:>8.4f}  {row.accuracy:>8.2%}  {row.aggregate!s:<59}  "
        f"{format_bytes(row.input_bytes):>9}  {format_bytes(row.traffic_bytes):>9}  "
        f"{row.seconds:>7.2f}"
    )


def format_step(row: StepRow) -> str:
    """One line per step of a round as it closes, above the round's table line: the round,
    the step, its peers (numbered from 1), the seconds from the round's start until a peer
    held its aggregate, and the aggregate's CID."""
    peers = " ".join(str(p) for p in row.peers)
    return (
        f"{row.round:>5}  step {row.step} closed at {row.seconds:.2f}s: peers {peers}, "
        f"aggregate {row.aggregate}"
    )


class DemoProgressBar:
    """``[####....] round 2 (3/20): training`` on stderr, redrawn in place; silent unless it is a terminal."""

    def __init__(
        self, total: int, stream: TextIO | None = None, *, enabled: bool | None = None
    ) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        tty = self.stream.isatty()
        self.enabled = tty if enabled is None else enabled and tty
        self._width = 0

    def show(self, round_: int, phase: str) -> None:
        if not self.enabled:
            return
        filled = 20 * round_ // self.total
        bar = "#" * filled + "." * (20 - filled)
        text = f"[{bar}] round {round_} ({round_ + 1}/{self.total}): {phase}"
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        """Erase the line (before printing a table row to a terminal)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def summary(result: DemoResult) -> dict[str, Any]:
    """The summary JSON: mode, aggregation method, rounds, final held-out accuracy and loss,
    the run's ``input_bytes`` and ``traffic_bytes`` (the rounds' sums, as ``RoundRow``
    counts them), the compression spec, the steps (each one's name, layers and peers
    numbered from 1; null without ``--steps``), the head record, the coordinator's did and
    the node."""
    last = result.rows[-1] if result.rows else None
    return {
        "mode": result.config.mode,
        "method": result.config.method,
        "rounds": len(result.rows),
        "accuracy": None if last is None else last.accuracy,
        "loss": None if last is None else last.loss,
        "input_bytes": sum(row.input_bytes for row in result.rows),
        "traffic_bytes": sum(row.traffic_bytes for row in result.rows),
        "compress": result.config.compress,
        "steps": [
            {"name": s.name, "tensors": s.selectors, "peers": [i + 1 for i in s.peers]}
            for s in result.steps
        ]
        or None,
        "head_record": None if result.head_record is None else str(result.head_record),
        "coordinator": result.coordinator,
        "node": result.node,
    }


def write_summary(result: DemoResult, path: str | Path) -> None:
    """Write :func:`summary` as JSON to ``path``."""
    Path(path).write_text(json.dumps(summary(result), indent=2) + "\n", encoding="utf-8")


def write_plot(rows: Sequence[RoundRow], path: str | Path, title: str = "") -> None:
    """Training loss and held-out accuracy per round, as an image (format from the suffix).

    Uses matplotlib's Agg canvas directly: no display, no global pyplot state.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        from ..errors import MissingExtraError

        raise MissingExtraError("demo", "--plot needs matplotlib") from exc
    fig = Figure(figsize=(8, 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    loss_ax, acc_ax = fig.subplots(1, 2)
    rounds = [r.round for r in rows]
    loss_ax.plot(rounds, [r.loss for r in rows], marker="o")
    loss_ax.set(xlabel="round", ylabel="training loss", title="loss")
    acc_ax.plot(rounds, [r.accuracy for r in rows], marker="o", color="tab:green")
    acc_ax.set(xlabel="round", ylabel="held-out accuracy", title="accuracy", ylim=(0, 1))
    for ax in (loss_ax, acc_ax):
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.savefig(str(path))
