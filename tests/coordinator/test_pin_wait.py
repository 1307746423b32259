"""A fetch attempt frees its worker once its input passed its checks, before its pin (which
waits on the node's lock and disk sync): ``verify_input``'s ``checked``."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from gradstore.coordinator import ByteBudget, verify_input
from gradstore.dag import CID
from gradstore.errors import RefusedError
from gradstore.format import Gradient
from gradstore.node import KuboDaemon
from gradstore.store import GradientStore

pytestmark = pytest.mark.kubo


def test_an_attempt_is_checked_before_it_waits_for_its_pin(kubo: KuboDaemon) -> None:
    async def go() -> None:
        async with kubo.node() as node:
            store = GradientStore(node)
            good = await store.put(Gradient({"w": np.ones(1000, "<f4")}), pin=False)
            nan = await store.put(Gradient({"w": np.full(1000, np.nan, "<f4")}), pin=False)
            events: list[str] = []
            pin = node.pin

            async def pinned(cid: CID, **kwargs: Any) -> None:
                events.append("pin")
                await pin(cid, **kwargs)

            node.pin = pinned  # type: ignore[method-assign]

            async def attempt(cid: CID) -> None:
                await verify_input(
                    node,
                    store,
                    "peer",
                    cid,
                    1,
                    expected=None,
                    resolve_timeout_s=10,
                    budget=ByteBudget(1 << 20),
                    keep=ByteBudget(1 << 20),
                    clip=False,
                    checked=lambda: events.append("checked"),
                )

            await attempt(good)
            assert events == ["checked", "pin"]
            events.clear()
            with pytest.raises(RefusedError, match="NaN"):
                await attempt(nan)
            assert events == []  # refused: never said checked, never pinned

    asyncio.run(go())
