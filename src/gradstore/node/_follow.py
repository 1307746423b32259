"""Follow a pubsub topic for as long as a service runs, through dropped subscriptions.

A Kubo restart, or a proxy closing the long-lived ``pubsub/sub`` stream, ends a
subscription with a ``NodeError``. A coordinator or a peer must not go deaf:
``follow`` reopens the subscription with backoff and keeps yielding messages.
Messages published while no subscription was open are lost, as pubsub always
allows; peers re-announce and the coordinator re-broadcasts, so nothing depends
on a single delivery.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Final

from ..errors import NodeError
from ._config import Retry
from .base import Node, PubsubMessage, Subscription

log = logging.getLogger("gradstore.node")

RESUBSCRIBE: Final = Retry(retries=None, backoff=0.5, factor=2.0, max_backoff=10.0)
"""Sleeps before each resubscription, for ever; they start again from 0.5 s once messages flow."""


async def follow(
    node: Node, sub: Subscription, *, retry: Retry = RESUBSCRIBE
) -> AsyncIterator[PubsubMessage]:
    """Every message of ``sub``'s topic, reopening the subscription whenever it fails.

    ``sub`` must already be entered; ``follow`` closes it (or its replacement) when the
    caller stops iterating. ``retry`` paces the resubscriptions (once a limited
    one runs out, ``follow`` raises ``NodeError``).
    """
    topic = sub.topic
    delays = retry.delays()
    try:
        while True:
            try:
                async for message in sub:
                    delays = retry.delays()
                    yield message
                reason = "the subscription ended"
            except NodeError as exc:
                reason = str(exc)
            log.warning("lost the subscription to %s (%s); resubscribing", topic, reason)
            await sub.__aexit__(None, None, None)
            while True:
                delay = next(delays, None)
                if delay is None:
                    raise NodeError(f"lost the subscription to {topic} ({reason}); gave up")
                await asyncio.sleep(delay)
                sub = node.subscribe(topic)
                try:
                    await sub.__aenter__()
                    log.info("subscribed to %s again", topic)
                    break
                except NodeError as exc:
                    reason = str(exc)
                    log.warning("resubscribing to %s failed (%s); retrying", topic, exc)
    finally:
        await sub.__aexit__(None, None, None)
