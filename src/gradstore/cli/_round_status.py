"""``gradstore round status``: a job's open round and last result, from its coordinator's
signed statuses and results (``_job_status`` builds what is shown); ``--watch`` prints it
again at each change, ``--json`` as one JSON object (with ``--watch``, JSON lines). A tree
job's status hears its root on the job's results topic and each group's leaf on the
group's (``Hearing``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import Final

from ..job import JobConfig, load_job
from ..node import Node
from ..peer import CoordinatorListener
from . import _exit
from ._job_status import HEAR_S, SILENT_S, JobStatus, job_status, tree_status
from ._nodes import node_from_args

#: Once the coordinator is heard, how long a one-shot status waits for the rest of what it
#: re-sends together (each step's status and result, the last round's result).
SETTLE_S: Final = 1.0

#: How often ``--watch`` looks again without news (for a coordinator gone silent).
_TICK_S: Final = 1.0

Emit = Callable[[JobStatus], None]


class Hearing:
    """What the command listens to: the job's coordinator (a tree's root), and in a tree job
    each group's leaf (``leaves``, by group name)."""

    def __init__(
        self,
        config: JobConfig,
        coordinator: CoordinatorListener,
        leaves: Mapping[str, CoordinatorListener] | None = None,
    ) -> None:
        self.config = config
        self.coordinator = coordinator
        self.leaves = dict(leaves or {})

    def status(self, since_ms: int, *, silent: bool = False) -> JobStatus:
        """The job as heard from messages stamped at ``since_ms`` or later."""
        view = self.coordinator.view
        if not self.leaves:
            return job_status(self.config, view, since_ms, silent=silent)
        groups = {name: leaf.view for name, leaf in self.leaves.items()}
        return tree_status(self.config, view, groups, since_ms, silent=silent)

    async def next_message(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for a fresh word of any listener; whether one came."""
        listeners = [self.coordinator, *self.leaves.values()]
        if len(listeners) == 1:
            return await self.coordinator.next_message(timeout)
        waits = [asyncio.create_task(one.next_message(timeout)) for one in listeners]
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return any(task.result() for task in done)


async def _hearing(stack: AsyncExitStack, config: JobConfig, node: Node) -> Hearing:
    """Listen to the job's coordinator and, in a tree job, to each group's leaf."""
    coordinator = await stack.enter_async_context(CoordinatorListener(config, node))
    leaves = {
        g.name: await stack.enter_async_context(
            CoordinatorListener(config.group_view(g.name), node, partials=True)
        )
        for g in config.groups
    }
    return Hearing(config, coordinator, leaves)


def cmd_round_status(args: argparse.Namespace) -> int:
    config = load_job(args.config)
    emit: Emit = _text(args.watch)
    if args.json:
        emit = _json_line if args.watch else _json

    async def run() -> None:
        node = node_from_args(args)
        try:
            since_ms = int(time.time() * 1000)
            async with AsyncExitStack() as stack:
                hearing = await _hearing(stack, config, node)
                if args.watch:
                    await watch(hearing, since_ms, emit)
                else:
                    emit(await once(hearing, since_ms))
        finally:
            await node.aclose()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        if not args.watch:
            raise
    return _exit.SUCCESS  # Ctrl-C is how a watch ends


async def once(hearing: Hearing, since_ms: int) -> JobStatus:
    """What the coordinator says within ``HEAR_S`` seconds (``SETTLE_S`` after it was heard)."""
    start = time.monotonic()
    heard_at: float | None = None
    while True:
        until = start + HEAR_S if heard_at is None else min(start + HEAR_S, heard_at + SETTLE_S)
        left = until - time.monotonic()
        if left <= 0:
            return hearing.status(since_ms)
        await hearing.next_message(left)
        if heard_at is None and hearing.status(since_ms).heard:
            heard_at = time.monotonic()


async def watch(hearing: Hearing, since_ms: int, emit: Emit) -> None:
    """``emit`` the job's status as ``once`` finds it, then again at each change, until the
    job's last round ended (or Ctrl-C); a coordinator silent for ``SILENT_S`` once heard
    is a change too."""
    shown = await once(hearing, since_ms)
    emit(shown)
    newest, heard_at = -1, time.monotonic()
    while not shown.complete:
        await hearing.next_message(_TICK_S)
        now = time.monotonic()
        run = hearing.coordinator.view.current
        if run is not None and run.last_sent_at >= max(since_ms, newest + 1):
            newest, heard_at = run.last_sent_at, now
        silent = now - heard_at > SILENT_S
        status = hearing.status(since_ms, silent=silent)
        if status != shown:
            emit(status)
            shown = status


def _json(status: JobStatus) -> None:
    print(json.dumps(_stamped(status), indent=2), flush=True)


def _json_line(status: JobStatus) -> None:
    print(json.dumps(_stamped(status)), flush=True)


def _stamped(status: JobStatus) -> dict[str, object]:
    return {"at_ms": int(time.time() * 1000), **status.to_json()}


def _text(watching: bool) -> Emit:
    """Print the status's lines; when watching, each time after a blank line, and with the
    time it was seen on its first line."""

    blank: list[str] = []

    def emit(status: JobStatus) -> None:
        lines = status.lines()
        if watching:
            lines = [*blank, f"{time.strftime('%H:%M:%S')} {lines[0]}", *lines[1:]]
            blank[:] = [""]
        print("\n".join(lines), flush=True)

    return emit
