"""Awaitable change notification for the test kit's fakes: every state change
notifies, and a test waits for a predicate with a timeout instead of sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class ChangeWaiter:
    """Mixin: ``await self._notify()`` after each change; tests ``await wait_for(...)``."""

    _changed: asyncio.Condition

    def _init_changes(self) -> None:
        self._changed = asyncio.Condition()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds (re-checked on every change), or TimeoutError."""

        async def waiter() -> None:
            async with self._changed:
                await self._changed.wait_for(predicate)

        await asyncio.wait_for(waiter(), timeout)
