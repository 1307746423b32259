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

from ..errors import NodeError
from .base import Node, PubsubMessage, Subscription

log = logging.getLogger("gradstore.node")

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 10.0


async def follow(node: Node, sub: Subscription) -> AsyncIterator[PubsubMessage]:
    """Every message of ``sub``'s topic, reopening the subscription whenever it fails.

    ``sub`` must already be entered; ``follow`` closes it (or its replacement) when the
    caller stops iterating.
    """
    topic = sub.topic
    delay = FIRST_DELAY_S
    try:
        while True:
            try:
                async for message in sub:
                    delay = FIRST_DELAY_S
                    yield message
                reason = "the subscription ended"
            except NodeError as exc:
                reason = str(exc)
            log.warning("lost the subscription to %s (%s); resubscribing", topic, reason)
            await sub.__aexit__(None, None, None)
            while True:
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_DELAY_S)
                sub = node.subscribe(topic)
                try:
                    await sub.__aenter__()
                    log.info("subscribed to %s again", topic)
                    break
                except NodeError as exc:
                    log.warning("resubscribing to %s failed (%s); retrying", topic, exc)
    finally:
        await sub.__aexit__(None, None, None)
