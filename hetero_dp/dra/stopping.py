"""How long a stopping DRA front end waits on the API server: :class:`StopBudget`.

From the moment a stop is asked (SIGTERM), the API server gets
:data:`STOP_API_BUDGET` seconds for the calls of a start still running and for
the stop's own (the pool removed); then the client is closed, which cuts every
call in flight, whatever the server does. A pod's default grace period is 30 s
(``terminationGracePeriodSeconds``, Kubernetes docs "Pod Lifecycle"); the
budget leaves the rest of it for the kubelet side of the stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger(__name__)

STOP_API_BUDGET = 10.0


class StopBudget:
    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self._cutoff: asyncio.TimerHandle | None = None

    async def start(self, starting: Awaitable[None], stop_asked: Awaitable[None]) -> None:
        """Await ``starting``; a stop asked meanwhile starts the budget."""
        start = asyncio.ensure_future(starting)
        asked = asyncio.ensure_future(stop_asked)
        try:
            await asyncio.wait({start, asked}, return_when=asyncio.FIRST_COMPLETED)
            if not start.done():  # SIGTERM while the start waits on the API server
                log.info("asked to stop while starting: the API server has %.0fs", STOP_API_BUDGET)
                self.arm()
            await start
        finally:
            asked.cancel()

    def arm(self) -> None:
        """The stop was asked: the budget runs from now (once)."""
        if self._cutoff is None:
            self._cutoff = asyncio.get_running_loop().call_later(STOP_API_BUDGET, self._cut)

    def done(self) -> None:
        """The stop is over: nothing is left waiting on the server."""
        if self._cutoff is not None:
            self._cutoff.cancel()
        self.api_client.close()

    def _cut(self) -> None:
        log.warning(
            "the API server did not answer the stop's calls within %.0fs; they are cut",
            STOP_API_BUDGET,
        )
        self.api_client.close()
