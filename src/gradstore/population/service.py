"""The population controller as a service: every interval of a population job, one after
another, each decision record linking the one before (``prev``).

A thin asyncio shell over ``run_interval`` (which collects, verifies, decides and stores one
interval): it opens the run with a signed next-interval message for interval 0, runs each
interval with the hyperparameters the previous decision gave every member, and re-sends the
newest next-interval message every ``rebroadcast_s`` (pubsub drops messages, and a member
that subscribed late must still hear where the job stands) until ``linger_s`` after the last.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from base64 import b32encode
from collections.abc import Callable

from ..dag.cid import CID
from ..errors import ConfigError
from ..job import JobConfig
from ..job._population import PopulationConfig
from ..messages.keys import SigningKey
from ..node import Node
from ..pbt.space import HValue
from .controller import IntervalResult, population_topics, run_interval
from .next import NextInterval, encode_next

log = logging.getLogger("gradstore.population")


def new_population_run() -> str:
    """A fresh run id: 128 random bits as 26 lowercase base32 characters (a round run's form)."""
    return b32encode(secrets.token_bytes(16)).decode("ascii").rstrip("=").lower()


def population_of(config: JobConfig) -> PopulationConfig:
    """The job's ``[population]`` section (``ConfigError`` for a job without one)."""
    if config.population is None:
        raise ConfigError(f"job {config.job} has no [population] section")
    return config.population


class PopulationController:
    """Runs every interval of one population job over one node, as the job's coordinator."""

    def __init__(
        self,
        config: JobConfig,
        key: SigningKey,
        node: Node,
        *,
        run: str | None = None,
        fetch_timeout_s: float = 30.0,
        rebroadcast_s: float = 1.0,
        linger_s: float = 2.0,
        on_interval: Callable[[IntervalResult], None] | None = None,
    ) -> None:
        self.pop = population_of(config)
        if key.did != config.coordinator:
            raise ConfigError(
                f"the key's id {key.did} is not the job's coordinator {config.coordinator}"
            )
        self.config = config
        self.key = key
        self.node = node
        self.run_id = run or new_population_run()
        self.fetch_timeout_s = fetch_timeout_s
        self.rebroadcast_s = rebroadcast_s
        self.linger_s = linger_s
        self.on_interval = on_interval
        self.results: list[IntervalResult] = []
        self._current = b""

    @property
    def head(self) -> CID | None:
        """The newest decision record (None before the first interval ends)."""
        return self.results[-1].record_cid if self.results else None

    async def _rebroadcast(self) -> None:
        topic = population_topics(self.config.job)[1]
        while True:
            await asyncio.sleep(self.rebroadcast_s)
            await self.node.publish(topic, self._current)

    async def run(self, stop: asyncio.Event | None = None) -> list[IntervalResult]:
        """Run the job's intervals (until ``stop`` is set, between two); return their results."""
        job, pop = self.config.job, self.pop
        reports_topic, next_topic = population_topics(job)
        hparams: dict[str, dict[str, HValue]] = pop.first_hparams()
        async with self.node.subscribe(reports_topic) as sub:
            self._current = encode_next(
                NextInterval(job, self.run_id, 0, None, int(time.time() * 1000)), self.key
            )
            await self.node.publish(next_topic, self._current)
            resender = asyncio.create_task(self._rebroadcast())
            try:
                for interval in range(len(self.results), pop.intervals):
                    if stop is not None and stop.is_set():
                        break
                    result = await run_interval(
                        self.node,
                        sub,
                        pop,
                        self.key,
                        job=job,
                        run=self.run_id,
                        interval=interval,
                        prev=self.head,
                        hparams=hparams,
                        fetch_timeout_s=self.fetch_timeout_s,
                    )
                    self._current = result.next_message
                    # a member no decision names (none reported: nobody to copy) keeps its own
                    hparams = {**hparams, **result.record.hparams_after()}
                    self.results.append(result)
                    for text in result.refused:
                        log.info("interval %d: refused a report: %s", interval, text)
                    if self.on_interval is not None:
                        self.on_interval(result)
                if self.linger_s > 0:
                    await asyncio.sleep(self.linger_s)  # still re-sending the last decision
            finally:
                resender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await resender
        return self.results
