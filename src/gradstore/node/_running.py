"""A Kubo to run on: the one ``find_api`` names if it answers, else one started here.

The demo, the examples and the scripts all need "the user's Kubo, or ours": one probe (short
timeouts, no retries, pubsub required) and one launcher, so they all say the same thing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import NodeError, NodeUnreachableError
from ._config import Retry
from ._connect import connect
from .kubo import KuboDaemon, Timeouts, find_api, find_kubo_binary

_PROBE_TIMEOUTS = Timeouts(connect=2.0, read=5.0, write=5.0, pool=2.0)


@dataclass(frozen=True)
class RunningKubo:
    """The Kubo in use: its RPC URL, a line that says which one, and whether we started it."""

    api: str
    description: str
    started: bool


async def answering_version(api: str, auth: str | None = None) -> str | None:
    """Kubo's version at ``api`` if it answers with pubsub enabled; None if nothing answers.

    A Kubo without pubsub cannot run a job, so it is an error (``NodeError``), not a miss.
    """
    probe = connect(api, auth=auth, timeouts=_PROBE_TIMEOUTS, retry=Retry(retries=0))
    try:
        try:
            version = await probe.version()
        except NodeError:
            return None
        try:
            await probe.pubsub_topics()
        except NodeError as exc:
            raise NodeError(
                f"the Kubo at {probe.api} has pubsub disabled ({exc}); run "
                "`ipfs config --json Pubsub.Enabled true` and restart it, or pass --local DIR"
            ) from exc
        return version
    finally:
        await probe.aclose()


@contextmanager
def running_kubo(api: str | None = None, auth: str | None = None) -> Iterator[RunningKubo]:
    """From synchronous code: the Kubo at ``api`` (else where ``find_api`` looks) if it
    answers, else the installed Kubo, started with its own temporary repo and stopped on exit.

    ``ValueError`` if ``api`` is no URL or multiaddr; ``NodeUnreachableError`` if nothing
    answers and no Kubo is installed (its message says how to get one).
    """
    try:
        url: str | None = find_api(api)
    except NodeUnreachableError as exc:  # an IPFS_PATH with no running daemon, say
        url, why = None, str(exc)
    else:
        why = f"nothing answered at {url}"
    version = None if url is None else asyncio.run(answering_version(url, auth))
    if url is not None and version is not None:
        yield RunningKubo(url, f"kubo {version} at {url}", started=False)
        return
    binary = find_kubo_binary()
    if binary is None:
        raise NodeUnreachableError(
            f"{why} and no Kubo is installed (run scripts/install-kubo.sh, or set GRADSTORE_API)"
        )
    daemon = KuboDaemon(binary).start()
    try:
        yield RunningKubo(
            daemon.api_url, f"kubo at {daemon.api_url} (started here; {why})", started=True
        )
    finally:
        daemon.stop()
