"""What the engine knows about one backend's devices: the discovered (physical)
records and two health overlays (events pushed by the backend's ``watch`` hook,
results of ``check_health`` polls). A device is healthy only when its record,
both overlays and its physical parent agree; the newest recovery event wins over
a discovery that started before it."""

from __future__ import annotations

import asyncio
import threading

from hetero_dp.engine.plugins import Backend
from hetero_dp.model.device import Device
from hetero_dp.model.events import EventSink


class BackendRuntime:
    """What the daemon knows about one backend's devices."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.discovered: dict[str, Device] = {}
        self.event_health: dict[str, tuple[bool, str]] = {}
        self.poll_health: dict[str, tuple[bool, str]] = {}
        self.faults: dict[str, str] = {}  # "discover" / "watch" -> reason
        self.published: dict[str, Device] = {}
        self.resources: dict[str, set[str]] = {}  # physical resource -> advertised names
        self.rediscover_wanted = asyncio.Event()
        self.sink: EventSink | None = None
        self.watch_thread: threading.Thread | None = None
        self.watch_task: asyncio.Task[None] | None = None
        self.poll_busy = False
        # Events are numbered; a discovery remembers the number current when it
        # started, so a "healthy" event that arrives while a slow discovery still
        # reads the old, unhealthy state wins over that stale verdict.
        self.event_seq = 0
        self.event_stamp: dict[str, int] = {}
        self.discovered_at = 0
        # Discoveries may overlap (the rediscovery loop, a reload): each is numbered,
        # and one that ends after a newer one has been applied is stale and dropped.
        self.discoveries = 0
        self.discovery_applied = 0

    def _newer_recovery(self, d: Device) -> str | None:
        for key in (d.parent, d.id):
            if key is None or key not in self.event_health:
                continue
            ok, why = self.event_health[key]
            if ok and self.event_stamp.get(key, 0) > self.discovered_at:
                return why
        return None

    def effective(self) -> list[Device]:
        fault = "; ".join(self.faults.values())
        overlays = (self.event_health, self.poll_health)
        out = []
        for d in self.discovered.values():
            healthy, reason = d.healthy, d.reason
            if not healthy and (recovered := self._newer_recovery(d)) is not None:
                healthy, reason = True, recovered
            # verdicts on the device and on its physical parent, events before polls
            verdicts = [
                o[k] for o in overlays for k in (d.parent, d.id) if k is not None and k in o
            ]
            if healthy:
                why = next((why for ok, why in verdicts if not ok), None)
                if why is not None:
                    healthy, reason = False, why
            if fault and healthy:
                healthy, reason = False, fault
            if healthy and not reason:
                # a recovery reason stays visible until the next change
                for ok, why in verdicts:
                    if ok:
                        reason = why or reason
            out.append(
                d if (healthy, reason) == (d.healthy, d.reason) else d.with_health(healthy, reason)
            )
        return out
