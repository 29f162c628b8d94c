"""Awaitable change notification for the test kit's fakes: every state change
notifies, and a test waits for a predicate with a timeout instead of sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import threading
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


async def wait_on(cond: threading.Condition, predicate: Callable[[], bool], timeout: float) -> bool:
    """Wait until ``predicate()`` holds under ``cond`` (a fake served from threads, which
    notifies it on each change); False after ``timeout`` seconds.

    The wait blocks a thread of its own, not one of the loop's default executor: the
    daemons under test run their blocking calls there (a DRA sync is one), and more
    waits at once than it has workers (``min(32, cores + 4)``: 6 on two cores) would
    hold back the very calls they wait for."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bool] = loop.create_future()

    def settle(ok: bool) -> None:
        if not done.done():
            done.set_result(ok)

    def wait() -> None:
        with cond:
            ok = cond.wait_for(predicate, timeout)
        with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
            loop.call_soon_threadsafe(settle, ok)

    threading.Thread(target=wait, name="wait_on", daemon=True).start()
    return await done
