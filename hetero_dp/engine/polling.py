"""Health polls of a backend's devices, and what follows from calls that got stuck.

A poll runs ``check_health`` over every discovered device (in chunks, off the
loop: :meth:`hetero_dp.engine.backend.Backend.check_health_many`), stamps the
verdicts with the time the poll started, and publishes only when a device's
newest verdict changed. The backend's worker threads report here, through the
loop, when the number of stuck calls crosses the cap (the whole backend turns
Unhealthy, then is polled again when they return) and when a stuck health check
finally returns (that device is judged again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from hetero_dp.engine.runtime import BackendRuntime
from hetero_dp.model.errors import BackendError

log = logging.getLogger("hetero_dp.engine.daemon")  # read as the daemon's lines

YIELD_EVERY = 512  # devices recorded between two yields to the loop


class HealthPolls:
    def __init__(
        self,
        publish: Callable[[BackendRuntime], Awaitable[None]],
        hook_error: Callable[[BackendRuntime, str, Exception], None],
        spawn: Callable[[Any], object],
    ) -> None:
        self.publish = publish
        self.hook_error = hook_error
        self.spawn = spawn

    async def poll(self, rt: BackendRuntime) -> None:
        if rt.poll_busy:  # a previous poll still runs: do not pile up
            return
        rt.poll_busy = True
        try:
            stamp = rt.tick()  # what the poll reports was read from now on
            devices = list(rt.discovered.values())
            verdicts = await rt.backend.check_health_many(devices, self._on_error(rt))
            changed = await self.record(rt, verdicts, stamp)
        finally:
            rt.poll_busy = False
        if changed:
            await self.publish(rt)

    def _on_error(self, rt: BackendRuntime) -> Callable[[BackendError], None]:
        return lambda e: self.hook_error(rt, "check_health", e)

    async def record(
        self, rt: BackendRuntime, verdicts: dict[str, tuple[bool, str]], stamp: int
    ) -> bool:
        """Store a poll's verdicts; True if any device's newest verdict changed. Large
        polls yield to the loop every few hundred devices."""
        changed = False
        for n, (device_id, (ok, why)) in enumerate(verdicts.items()):
            if n % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # let other resources' calls run meanwhile
            d = rt.discovered.get(device_id)
            if d is None:  # gone while polled: would outlive it
                continue
            before = rt.newest(device_id)
            was = before[:2] if before is not None else (d.healthy, d.reason)
            if before is None or stamp >= before[2]:
                rt.poll_health[device_id] = (ok, why, stamp)
                changed = changed or was != (ok, why)
        return changed

    async def recheck(self, rt: BackendRuntime, device_id: str) -> None:
        """Judge one device again now (its stuck health check finally returned)."""
        d = rt.discovered.get(device_id)
        if d is None:
            return
        stamp = rt.tick()
        verdicts = await rt.backend.check_health_many([d], self._on_error(rt))
        if await self.record(rt, verdicts, stamp):
            await self.publish(rt)

    def stuck_changed(self, rt: BackendRuntime) -> None:
        """The number of the backend's stuck calls changed: past the cap, every device
        of the backend is Unhealthy with the reason; below it again, they recover."""
        reason = rt.backend.stuck_reason
        if reason == rt.faults.get("stuck", ""):
            return
        if reason:
            if "stuck" not in rt.faults:
                log.error("%s", reason, extra={"backend": rt.backend.name})
            rt.faults["stuck"] = reason
            self.spawn(self.publish(rt))
        else:
            log.info("backend %r: its stuck calls returned", rt.backend.name)
            rt.faults.pop("stuck", None)
            self.spawn(self.publish(rt))
            if rt.backend.implements("check_health"):
                # devices whose checks were refused meanwhile are judged again now
                self.spawn(self.poll(rt))

    def wire(self, rt: BackendRuntime) -> None:
        """Let the backend's worker threads reach the loop: stuck calls, late returns."""
        loop = asyncio.get_running_loop()

        def stuck_changed() -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self.stuck_changed, rt)

        def returned(hook: str, key: str) -> None:
            if hook == "check_health" and not loop.is_closed():
                loop.call_soon_threadsafe(self.spawn, self.recheck(rt, key))

        rt.backend.on_stuck_change = stuck_changed
        rt.backend.on_returned = returned
        rt.backend.warm()
