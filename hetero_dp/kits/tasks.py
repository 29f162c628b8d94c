"""The long-lived tasks of one owner, started through one helper that names and guards
them.

Each task has a unique name: starting a name again replaces the task of that name
(the old one is cancelled), so a loop is restarted by name, never found again by
matching names across lists. A task that ends with an exception other than a
cancellation is logged with its name: a loop that died is never silent. Short
background work (a publish after a health event) goes through :meth:`Tasks.spawn`,
which only keeps a reference until it ends (the loop holds tasks weakly).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from hetero_dp.kits.aiotools import cancel_and_wait

log = logging.getLogger(__name__)


class Tasks:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._named: dict[str, asyncio.Task[Any]] = {}
        self._background: set[asyncio.Task[Any]] = set()

    def start(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as the task ``name``, cancelling a running task of that name."""
        self.cancel(name)
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.owner}: {name}")
        self._named[name] = task
        task.add_done_callback(lambda t: self._ended(name, t))
        return task

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run short background work; not cancelled by :meth:`stop` (it ends by itself)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def cancel(self, name: str) -> bool:
        """Cancel the task ``name``; True if one was running."""
        task = self._named.pop(name, None)
        if task is None or task.done():
            return False
        task.cancel()
        return True

    def get(self, name: str) -> asyncio.Task[Any] | None:
        return self._named.get(name)

    def names(self) -> list[str]:
        """The names of the tasks running now."""
        return sorted(n for n, t in self._named.items() if not t.done())

    async def stop(self, timeout: float) -> list[str]:
        """Cancel every named task and wait at most ``timeout`` seconds; returns the
        names of those still running then (the caller logs them and goes on)."""
        tasks, self._named = list(self._named.values()), {}
        return await cancel_and_wait(tasks, timeout)

    def _ended(self, name: str, task: asyncio.Task[Any]) -> None:
        if self._named.get(name) is task:
            del self._named[name]
        if task.cancelled():
            return
        e = task.exception()
        if e is not None:
            log.error("%s: task %r ended with %r", self.owner, name, e, exc_info=e)
