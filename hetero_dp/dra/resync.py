"""Keeping a DRA driver's ResourceSlices right: the API connection, publishing,
the slice watch and the periodic resync.

A driver that cannot reach the API server at start still serves the kubelet; the
resync loop connects later and publishes then. A watch on our slices (when enabled)
repairs a slice someone changed or deleted at once; the periodic resync
(``resync_interval``) catches whatever the watch missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.publisher import SlicePublisher
from hetero_dp.dra.watch import SliceWatch
from hetero_dp.kits.aiotools import wait_event
from hetero_dp.model.device import Device

log = logging.getLogger(__name__)

WATCH_STOP_TIMEOUT = 5.0
RESYNC_JITTER = 0.5  # as client-go's wait.JitterUntil spreads periodic work, downwards


class SliceSync:
    """Publishes ``devices()`` of driver ``name`` through ``publisher``;
    ``api_versions`` are the resource.k8s.io versions to try, ``resync_interval()``
    the seconds between checks (0: none), ``watch_slices`` whether to watch our
    slices; ``running()`` says whether the driver still serves."""

    def __init__(
        self,
        name: str,
        api: ResourceAPI,
        publisher: SlicePublisher,
        *,
        api_versions: tuple[str, ...],
        resync_interval: Callable[[], float],
        watch_slices: bool,
        devices: Callable[[], list[Device]],
        running: Callable[[], bool],
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.name = name
        self.rand = rand
        self.api = api
        self.publisher = publisher
        self.api_versions = api_versions
        self.resync_interval = resync_interval
        self.watch_slices = watch_slices
        self.devices = devices
        self.running = running
        self.api_ready = False
        self.slice_watch: SliceWatch | None = None
        self._resync_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resync_now = asyncio.Event()

    async def connect(self) -> bool:
        """Find the API version the server serves and start the publisher; False
        (logged) while the API server is not usable."""
        try:
            version = await asyncio.to_thread(self.api.detect, self.api_versions)
            await self.publisher.start()
        except APIError as e:
            log.error("DRA driver %s: API server not usable yet: %s", self.name, e)
            return False
        if not self.api_ready:
            log.info("DRA driver %s uses resource.k8s.io/%s", self.name, version)
        self.api_ready = True
        return True

    async def start(self) -> None:
        """Publish (when connected), then watch our slices and resync periodically."""
        if self.api_ready:
            await self.publisher.publish(self.devices())
        self._loop = asyncio.get_running_loop()
        if self.watch_slices:
            self.slice_watch = self.publisher.watch(self._on_slices_changed)
            self.slice_watch.start()
        self._resync_task = asyncio.get_running_loop().create_task(
            self._resync_loop(), name=f"dra resync {self.name}"
        )

    async def publish(self) -> None:
        """The devices changed: publish them, if the driver serves and is connected."""
        if self.running() and self.api_ready:
            await self.publisher.publish(self.devices())

    def resync_soon(self) -> None:
        """Wake the resync loop (on the loop's thread)."""
        self._resync_now.set()

    def _on_slices_changed(self, why: str) -> None:
        """From the watch thread: someone changed our slices; sync now."""
        loop = self._loop
        if loop is None or not self.running():
            return
        log.debug("DRA driver %s: %s; syncing", self.name, why)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._resync_now.set)

    async def resync(self) -> None:
        """Check the API server now: reconnect if needed, recreate vanished slices."""
        if not self.api_ready:
            if not await self.connect():
                return
            await self.publisher.publish(self.devices())
            return
        await self.publisher.sync()

    async def _resync_loop(self) -> None:
        while True:
            await wait_event(self._resync_now, self._next_check())
            self._resync_now.clear()
            try:
                await self.resync()
            except Exception:
                log.exception("DRA driver %s: resync failed", self.name)

    def _next_check(self) -> float | None:
        """Seconds to the next periodic check: the interval scaled by a random factor
        in [1 - RESYNC_JITTER, 1], so drivers started together (a fleet rolled out at
        once) do not check the server in the same second (None: no periodic check)."""
        interval = self.resync_interval()
        if not interval:
            return None
        return interval * (1.0 - RESYNC_JITTER * self.rand())

    async def stop_watch(self) -> None:
        """Stop publishing retries and the slice watch (first in a stop)."""
        self.publisher.cancel_retry()
        if self.slice_watch is not None:
            self.slice_watch.stop()
            if not await asyncio.to_thread(self.slice_watch.join, WATCH_STOP_TIMEOUT):
                log.warning("DRA driver %s: the slice watch did not stop in time", self.name)
            self.slice_watch = None

    async def stop_resync(self) -> None:
        if self._resync_task is not None:
            self._resync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resync_task
            self._resync_task = None
