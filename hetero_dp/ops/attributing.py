"""The daemon's one :class:`~hetero_dp.usage.attribution.Attribution`, refreshed by
scrapes of ``/metrics`` and by a loop of its own (``attribution.interval``).

The noisy-neighbour WARNING (:mod:`hetero_dp.usage.neighbours`) follows each
refresh; without the loop it would come only when someone scrapes. Scrapes and the
loop share the one Attribution, so its caches (the pod-resources answer, the
checkpoint, the cgroup files) serve both; and the loop skips a round when a scrape
refreshed within the interval: at most one pod-resources call per scrape or per
interval, never both. The loop is a task of its own, off the Allocate path (the
readings run in a worker thread); a round that raises is logged, rarely while it
repeats, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from hetero_dp.kits.logs import Repeats
from hetero_dp.model.usage import ProcessUsage
from hetero_dp.usage import source
from hetero_dp.usage.attribution import Attribution

if TYPE_CHECKING:
    from hetero_dp.engine.daemon import Daemon

log = logging.getLogger("hetero_dp.usage")

#: seconds the loop's ``usage`` hooks may take (as a scrape's)
USAGE_TIMEOUT = 5.0
#: DRA with ``attribution.interval`` 0: scrapes re-read a claim at most this often
CLAIM_GAP = 30.0


class Attributing:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.attribution: Attribution | None = None
        self.last_refresh = -1e18  # monotonic time the last refresh began
        self.rounds = 0  # the loop's refreshes, for tests
        self._task: asyncio.Task[None] | None = None
        self._interval = 0.0
        self._repeats = Repeats()

    def _dra(self) -> bool:
        return callable(getattr(self.daemon.front_end, "claim_holders", None))

    async def _claims(self, gap: float) -> None:
        """DRA: re-read who the prepared claims are reserved for (the front end's
        ``refresh_claim_holders``, each claim at most once per ``gap`` seconds)."""
        refresh = getattr(self.daemon.front_end, "refresh_claim_holders", None)
        if callable(refresh):
            await refresh(gap)

    async def refresh(self, usage: Iterable[ProcessUsage], pids: Iterable[int] = ()) -> None:
        """Who holds and uses what (device-plugin mode; docs/operations.md, Attribution):
        one pod-resources call at most, the rest in one worker thread. DRA: the claims
        say who holds what; a scrape re-reads them only where no loop does."""
        daemon = self.daemon
        if self._dra():
            if self._interval <= 0:
                await self._claims(CLAIM_GAP)
            return
        if not daemon.resources:
            return
        settings = source.settings(daemon.config)
        if self.attribution is None or self.attribution.settings != settings:
            self.attribution = Attribution(settings)  # a reload may move the socket
        self.last_refresh = time.monotonic()
        await self.attribution.refresh(source.inventory(daemon), usage, pids)

    # --- the loop ------------------------------------------------------------

    def start(self, interval: float) -> None:
        """(Re)start the loop for ``interval`` seconds (0: none, scrapes only)."""
        if self._task is not None and interval == self._interval and not self._task.done():
            return
        self.stop()
        self._interval = interval
        if interval > 0:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(interval), name="attribution refresh"
            )

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _loop(self, interval: float) -> None:
        while True:
            left = self.last_refresh + interval - time.monotonic()
            if left > 0:
                await asyncio.sleep(left)  # the period (or what a scrape left of it)
                continue
            await self._surviving(self._round())

    async def _round(self) -> None:
        if self._dra():
            self.last_refresh = time.monotonic()
            self.rounds += 1
            await self._claims(self._interval)
            return
        if not self.daemon.resources:
            self.last_refresh = time.monotonic()  # nothing to attribute yet: wait a period
            return
        usage = await source.usages(self.daemon, USAGE_TIMEOUT)
        self.rounds += 1
        await self.refresh(usage)

    async def _surviving(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception as e:
            self.last_refresh = time.monotonic()  # tried: the next round a period on
            show, left_out = self._repeats.check(repr(e))
            if show:
                more = f" ({left_out} repeats not logged)" if left_out else ""
                log.error("attribution refresh failed, tried again next round%s", more, exc_info=e)
