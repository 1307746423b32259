"""``gradstore round status``: a job's open round and last result, from its coordinator's
signed statuses and results (``_job_status`` builds what is shown); ``--watch`` prints it
again at each change, ``--json`` as one JSON object (with ``--watch``, JSON lines)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from typing import Final

from ..job import JobConfig, load_job
from ..peer import CoordinatorListener
from . import _exit
from ._job_status import HEAR_S, SILENT_S, JobStatus, job_status
from ._nodes import node_from_args

#: Once the coordinator is heard, how long a one-shot status waits for the rest of what it
#: re-sends together (each step's status and result, the last round's result).
SETTLE_S: Final = 1.0

#: How often ``--watch`` looks again without news (for a coordinator gone silent).
_TICK_S: Final = 1.0

Emit = Callable[[JobStatus], None]


def cmd_round_status(args: argparse.Namespace) -> int:
    config = load_job(args.config)
    emit: Emit = _text(args.watch)
    if args.json:
        emit = _json_line if args.watch else _json

    async def run() -> None:
        node = node_from_args(args)
        try:
            since_ms = int(time.time() * 1000)
            async with CoordinatorListener(config, node) as listener:
                if args.watch:
                    await watch(listener, config, since_ms, emit)
                else:
                    emit(await once(listener, config, since_ms))
        finally:
            await node.aclose()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        if not args.watch:
            raise
    return _exit.SUCCESS  # Ctrl-C is how a watch ends


async def once(listener: CoordinatorListener, config: JobConfig, since_ms: int) -> JobStatus:
    """What the coordinator says within ``HEAR_S`` seconds (``SETTLE_S`` after it was heard)."""
    start = time.monotonic()
    heard_at: float | None = None
    while True:
        until = start + HEAR_S if heard_at is None else min(start + HEAR_S, heard_at + SETTLE_S)
        left = until - time.monotonic()
        if left <= 0:
            return job_status(config, listener.view, since_ms)
        await listener.next_message(left)
        if heard_at is None and job_status(config, listener.view, since_ms).heard:
            heard_at = time.monotonic()


async def watch(
    listener: CoordinatorListener, config: JobConfig, since_ms: int, emit: Emit
) -> None:
    """``emit`` the job's status as ``once`` finds it, then again at each change, until the
    job's last round ended (or Ctrl-C); a coordinator silent for ``SILENT_S`` once heard
    is a change too."""
    shown = await once(listener, config, since_ms)
    emit(shown)
    newest, heard_at = -1, time.monotonic()
    while not shown.complete:
        await listener.next_message(_TICK_S)
        now = time.monotonic()
        run = listener.view.current
        if run is not None and run.last_sent_at >= max(since_ms, newest + 1):
            newest, heard_at = run.last_sent_at, now
        silent = now - heard_at > SILENT_S
        status = job_status(config, listener.view, since_ms, silent=silent)
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
