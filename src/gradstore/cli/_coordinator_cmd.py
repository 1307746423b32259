"""``gradstore coordinator``: run a job's rounds, saying where the open round stands.

stdout gets one line per round (``format_outcome``); stderr gets "waiting for peers" lines
while a round is open. Exit 0 when every round closed, ``ROUND_FAILED`` when every round
ran and one failed, ``INTERRUPTED`` when stopped by a signal. Started again on the state
folder of a finished job, it says "job ... already complete" and exits 0 (a supervisor that
restarts it on failure then stops).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..coordinator import Coordinator, Journal, RoundOutcome, RoundProgress, format_outcome
from ..coordinator.spill import SpillDir
from ..coordinator.tree import TreeRoot
from ..job import JobConfig, load_job
from ..messages import SigningKey
from . import _exit
from ._nodes import node_from_args, pinned_through

#: How often the open round's progress is looked at.
PROGRESS_TICK_S = 1.0


class RoundProgressLines:
    """Decides when the open round's "waiting for peers" line is printed.

    A line when the round opens, when its counts change (at most every ``min_gap_s``, so
    thousands of announcements do not flood the terminal), and every ``every_s`` otherwise,
    so a quiet round still shows its deadline coming.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        every_s: float = 10.0,
        min_gap_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.every_s = every_s
        self.min_gap_s = min_gap_s
        self.clock = clock
        self._shown: tuple[object, ...] | None = None
        self._at = float("-inf")

    def tick(self, progress: RoundProgress | None) -> None:
        """Look at the open round (None: no round open) and print a line if one is due."""
        if progress is None:
            self._shown = None
            return
        key = (
            progress.round,
            progress.expected,
            progress.received,
            progress.verified,
            progress.failed,
            progress.deadline_in is None,  # the clock started
        )
        now = self.clock()
        new_round = self._shown is None or self._shown[0] != progress.round
        changed = key != self._shown and now - self._at >= self.min_gap_s
        if new_round or changed or now - self._at >= self.every_s:
            self.stream.write(progress.line() + "\n")
            self.stream.flush()
            self._shown, self._at = key, now


@dataclass(frozen=True)
class Finished:
    """A job whose every round is done and published, as its journal says."""

    rounds: int
    failed: int
    head: str | None


def finished_job(state: Path, config: JobConfig, coordinator: str | None = None) -> Finished | None:
    """The journal's word that this job is done, or None (not begun, open, or unpublished);
    ``coordinator``: the did the journal is bound to (default the job's; in a job split
    among coordinators, a step owner's own)."""
    path = state / "journal.sqlite"
    count = config.rounds.count
    if count == 0 or not path.is_file():
        return None
    with Journal(path) as journal:
        if (journal.get_meta("job"), journal.get_meta("coordinator")) != (
            config.job,
            coordinator or config.coordinator,
        ):
            return None  # another job's folder: the coordinator itself refuses it
        rows = [row for row in journal.rounds() if row.round < count]
    done = [row for row in rows if row.state in ("closed", "failed")]
    if len(done) < count or any(row.state == "closed" and not row.published for row in done):
        return None
    closed = [row for row in done if row.state == "closed"]
    return Finished(count, count - len(closed), closed[-1].record if closed else None)


def _complete_line(config: JobConfig, state: Path, done: Finished, argv: str) -> str:
    """What a coordinator started on a finished job's journal says: the job's end, and the
    command that runs it again (``argv``: its own options, then a new ``--state``)."""
    head = f", head record {done.head}" if done.head else ""
    return (
        f"job {config.job} already complete: {done.rounds} round(s), {done.failed} failed"
        f"{head} (state {state}); nothing to do. To run the job again, give it a new "
        f"journal: gradstore coordinator {argv} --state {_next_state(state)} "
        f"(or remove {state})"
    )


def _options(args: argparse.Namespace) -> str:
    """The options that name this coordinator's job, key and node, quoted for a shell."""
    words = ["--config", args.config, "--key", args.key]
    for option in ("api", "local"):
        value = getattr(args, option, None)
        if value:
            words += [f"--{option}", value]
    return shlex.join(words)


def _next_state(state: Path) -> Path:
    """A journal folder beside ``state`` that does not exist yet: ``walkthrough-2``, ``-3``..."""
    stem = state.name
    n = 2
    while (state.parent / f"{stem}-{n}").exists():
        n += 1
    return state.parent / f"{stem}-{n}"


def _logging(args: argparse.Namespace) -> None:
    level = (
        logging.WARNING
        if args.verbose == 0
        else logging.INFO
        if args.verbose == 1
        else logging.DEBUG
    )
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _state_dir(args: argparse.Namespace, config: JobConfig) -> Path:
    return Path(args.state) if args.state else Path("gradstore-state") / config.job


def _report(outcome: RoundOutcome) -> None:
    print(format_outcome(outcome), flush=True)


def _stop_on_signals() -> asyncio.Event:
    """An event SIGINT and SIGTERM set (the running loop's handlers)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _ended(config: JobConfig, round_: int, outcomes: list[RoundOutcome]) -> int | None:
    """INTERRUPTED if the job's rounds did not all run (stopped by a signal: the journal
    keeps the open round); RoundsFailedError if one failed; else None (all closed)."""
    count = config.rounds.count
    if count == 0 or round_ < count:
        return _exit.INTERRUPTED
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        first = failed[0]
        raise _exit.RoundsFailedError(
            f"{len(failed)} of {len(outcomes)} round(s) of job {config.job} "
            f"failed; round {first.round}: {first.reason}"
        )
    return None


def _run_tree_root(args: argparse.Namespace, config: JobConfig, key: SigningKey) -> int:
    """The root of a tree job: hears the leaves, combines their partials (``TreeRoot``)."""
    state = _state_dir(args, config)

    async def run() -> TreeRoot:
        stop = _stop_on_signals()
        node = pinned_through(node_from_args(args), config)
        try:
            print(f"tree root {key.did} for job {config.job} on {node.name}", file=sys.stderr)
            root = TreeRoot(config, key, node, state, on_round=_report)
            await root.run(stop)
            return root
        finally:
            await node.aclose()

    root = asyncio.run(run())
    ended = _ended(config, root.round, root.outcomes)
    return _exit.SUCCESS if ended is None else ended


def cmd_coordinator(args: argparse.Namespace) -> int:
    config = load_job(args.config)
    if config.population is not None:  # the coordinator's role in a population job
        from ._population_cmds import cmd_population_controller

        return cmd_population_controller(args, config)
    key = SigningKey.load(args.key)
    if config.tree:  # docs/design/multicoord.md: a leaf runs its group, the root combines
        led = config.group_led_by(key.did)
        if led is not None:
            config = config.group_view(led.name)
        elif key.did == config.coordinator:
            _logging(args)
            return _run_tree_root(args, config, key)
    _logging(args)
    state = _state_dir(args, config)
    done = finished_job(state, config, key.did)
    if done is not None:
        print(_complete_line(config, state, done, _options(args)), file=sys.stderr, flush=True)
        return _exit.SUCCESS

    async def run() -> Coordinator:
        stop = _stop_on_signals()
        node = pinned_through(node_from_args(args), config)
        try:
            ident = await node.identity()
            print(
                f"coordinator {key.did} for job {config.job} on {node.name} ({ident.peer_id})",
                file=sys.stderr,
                flush=True,
            )
            spill: bool | SpillDir = not args.no_spill  # --spill: the default, said aloud
            if args.spill_dir is not None:  # a folder of its own in it (a start empties it)
                spill = SpillDir(Path(args.spill_dir) / f"gradstore-spill-{config.job}")
            coordinator = Coordinator(config, key, node, state, on_round=_report, spill=spill)
            lines = RoundProgressLines(sys.stderr)

            async def show_progress() -> None:
                while True:
                    lines.tick(coordinator.progress())
                    await asyncio.sleep(PROGRESS_TICK_S)

            shower = asyncio.create_task(show_progress())
            try:
                await coordinator.run(stop)
            finally:
                shower.cancel()
                await asyncio.gather(shower, return_exceptions=True)
            return coordinator
        finally:
            await node.aclose()

    coordinator = asyncio.run(run())
    ended = _ended(config, coordinator.round, coordinator.outcomes)
    if ended is not None:
        return ended
    if not coordinator.outcomes:  # finished in an earlier run; this one only published
        done = finished_job(state, config, key.did)
        if done is not None:
            print(_complete_line(config, state, done, _options(args)), file=sys.stderr, flush=True)
    return _exit.SUCCESS
