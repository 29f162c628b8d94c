"""What the engine knows about one backend's devices: the discovered (physical)
records and two health overlays (events pushed by the backend's ``watch`` hook,
results of ``check_health`` polls). A device is healthy only when its record,
both overlays and its physical parent agree; the newest recovery event wins over
a discovery that started before it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from hetero_dp.allocation.gate import Refused, gate_device
from hetero_dp.engine.backend import Backend
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError
from hetero_dp.model.events import EventSink

# (healthy, reason, stamp): a verdict and when it was taken, on the runtime's clock
Verdict = tuple[bool, str, int]


class BackendRuntime:
    """What the daemon knows about one backend's devices.

    Health comes from three sources: the discovered record itself, events pushed
    by the watch hook, and check_health polls. Each verdict is stamped on one
    clock (:meth:`tick`): an event when it arrives, a poll and a discovery when
    they start (what they report was read then). For each device the newest
    verdict wins, whatever its source, and a device is healthy only when its own
    newest verdict and its physical parent's newest verdict both say so: a
    recovery reaches the kubelet at once, never a poll interval late, and a poll
    that started before an event cannot undo it.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.discovered: dict[str, Device] = {}
        # Dirs where plain files may stand for device nodes (the container gate):
        # empty in production, the temp dir under the testing harness and in a trial.
        self.fake_node_roots: tuple[str, ...] = ()
        self.event_health: dict[str, Verdict] = {}
        self.poll_health: dict[str, Verdict] = {}
        self.faults: dict[str, str] = {}  # "discover" / "watch" / "stuck" -> reason
        self.published: dict[str, Device] = {}
        self.resources: dict[str, set[str]] = {}  # physical resource -> advertised names
        self.rediscover_wanted = asyncio.Event()
        self.sink: EventSink | None = None
        self.watch_thread: threading.Thread | None = None
        self.watch_task: asyncio.Task[None] | None = None
        self.poll_busy = False
        self.clock = 0
        self.discovered_at = 0  # the clock when the applied discovery started
        # Discoveries may overlap (the rediscovery loop, a reload): each is numbered,
        # and one that ends after a newer one has been applied is stale and dropped.
        self.discoveries = 0
        self.discovery_applied = 0

    async def discover(self, on_error: Callable[[str, Exception], None]) -> None:
        """Run the backend's discover hook and apply what it found, unless a newer
        discovery was applied meanwhile; a failure is a fault on every device."""
        self.discoveries += 1
        number, started_at = self.discoveries, self.tick()
        try:
            devices = await self.backend.call("discover")
        except BackendError as e:
            on_error("discover", e)
            if number > self.discovery_applied:
                self.discovery_applied = number
                self.faults["discover"] = f"discovery failed: {str(e.__cause__ or '') or e}"
            return
        if number < self.discovery_applied:
            return
        self.discovery_applied = number
        self.faults.pop("discover", None)
        self.discovered = {d.id: gate_device(d, self.fake_node_roots) for d in devices}
        self.discovered_at = started_at
        known = set(self.discovered) | {d.parent for d in devices if d.parent}
        for overlay in (self.event_health, self.poll_health):
            for key in [k for k in overlay if k not in known]:
                del overlay[key]

    def tick(self) -> int:
        """The next stamp on this runtime's clock."""
        self.clock += 1
        return self.clock

    def newest(self, key: str) -> Verdict | None:
        """The newest event or poll verdict on ``key`` (a device or a parent)."""
        e = self.event_health.get(key)
        p = self.poll_health.get(key)
        if e is None:
            return p
        if p is None:
            return e
        return e if e[2] >= p[2] else p

    def effective(self) -> list[Device]:
        fault = "; ".join(self.faults.values())
        out = []
        for d in self.discovered.values():
            if isinstance(d.reason, Refused):
                out.append(d)  # refused by the gate: no event or poll makes it serve
                continue
            own: Verdict = (d.healthy, d.reason, self.discovered_at)
            reported = self.newest(d.id)
            if reported is not None and reported[2] > own[2]:
                own = reported
            parent = self.newest(d.parent) if d.parent is not None else None
            healthy, reason = own[0], own[1]
            if healthy and parent is not None and not parent[0]:
                healthy, reason = False, parent[1]
            if healthy and fault:
                healthy, reason = False, fault
            if healthy and not reason and parent is not None:
                reason = parent[1]  # a parent's recovery reason stays visible
            out.append(
                d if (healthy, reason) == (d.healthy, d.reason) else d.with_health(healthy, reason)
            )
        return out
