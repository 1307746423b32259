"""``async with x:`` for anything with an ``aclose()``: nodes and subscriptions."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncClosing:
    """Mixin: entering returns the object, leaving awaits ``aclose()``."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Closing:
    """Mixin: ``with x:`` returns the object and calls ``close()`` on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
