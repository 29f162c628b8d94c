"""A backend of simulated accelerators, registered like any third-party backend.

Options (``backends.simulated`` in the config, or ``-o simulated.KEY=VALUE``) are
declared by :class:`SimulatedOptions`; ``hetero-dp list --options simulated``
prints them.

Each device is delivered as ``/dev/null`` at ``/dev/sim<N>`` in the container
(so a real container runtime can start it) plus ``SIM_VISIBLE_DEVICES``.
Tests drive health and the device set with :meth:`SimulatedBackend.set_health`
and :meth:`SimulatedBackend.set_count`.

Per-process usage is simulated too: the ``processes`` option (or
:meth:`SimulatedBackend.set_processes`) lists what the ``usage`` hook reports, so the
framework's attribution (docs/operations.md) can be tried without a driver: the PIDs
are whatever the option says, looked up in the ``/proc`` attribution reads.

Every option takes effect on a config reload: ``count``, ``resource(s)`` and
``numaNodes`` at the rediscovery the reload runs, ``flipEvery`` at once (the
flipping restarts with the new period, or stops and leaves the device healthy).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass

from hetero_dp import (
    ConfigError,
    Device,
    DeviceNode,
    EventSink,
    Link,
    ProcessUsage,
    hookimpl,
    option,
)

BOARD_SIZE = 2  # devices per simulated board


@dataclass(frozen=True)
class SimulatedOptions:
    """The simulated backend's options."""

    count: int = option(4, help="devices per resource", min=0, max=4096)
    resource: str = option("hetero-dp.io/sim", help="the resource name")
    resources: tuple[str, ...] = option(
        (), help="several resource names, each with count devices (instead of resource)"
    )
    numa_nodes: int = option(
        2, help="boards spread round-robin over this many NUMA nodes (0: none)", min=0, max=64
    )
    processes: tuple[str, ...] = option(
        (),
        help="simulated per-process usage the usage hook reports, each "
        "'DEVICE:PID:MEMORY_MIB[:UTILIZATION]' (utilization 0 to 1)",
        max=100_000,
    )
    flip_every: float = option(
        0.0,
        help="seconds between health flips of the first device (unhealthy, then healthy "
        "again), to watch health reach the kubelet; 0 turns flips off",
        min=0,
        max=86400,
    )


def board(index: int) -> int:
    """The board a device sits on: devices 0 and 1 share board 0, and so on. A board
    sits inside one NUMA node, as a real multi-GPU board sits behind one PCIe switch
    of one socket, so a same-board pair is also a NUMA-local one."""
    return index // BOARD_SIZE


def parse_process(text: str) -> ProcessUsage:
    """``DEVICE:PID:MEMORY_MIB[:UTILIZATION]`` as a ProcessUsage."""
    parts = text.split(":")
    try:
        if len(parts) not in (3, 4):
            raise ValueError("expected DEVICE:PID:MEMORY_MIB[:UTILIZATION]")
        util = float(parts[3]) if len(parts) == 4 else None
        return ProcessUsage(parts[0], int(parts[1]), int(parts[2]) * 1024 * 1024, util)
    except ValueError as e:
        raise ConfigError(f"process {text!r}: {e}", field="processes") from None


class SimulatedBackend:
    hetero_dp_name = "simulated"

    def __init__(self) -> None:
        self.count = 4
        self.resources = ["hetero-dp.io/sim"]
        self.numa_nodes = 2
        self.flip_every = 0.0
        self.sinks: list[EventSink] = []
        self.processes: list[ProcessUsage] = []
        # (loop, event) per running watch: set when the options change
        self._wakeups: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.unhealthy: dict[str, str] = {}
        self._lock = threading.Lock()

    # --- hooks -----------------------------------------------------------

    @hookimpl
    def configure(self, options: SimulatedOptions) -> None:
        self.count = options.count
        self.numa_nodes = options.numa_nodes
        changed = options.flip_every != self.flip_every
        self.flip_every = options.flip_every
        self.resources = list(options.resources) or [options.resource]
        self.processes = [parse_process(p) for p in options.processes]
        if changed:  # hooks may run in a worker thread: wake each watch on its loop
            for loop, wake in list(self._wakeups):
                with contextlib.suppress(RuntimeError):  # that loop has closed
                    loop.call_soon_threadsafe(wake.set)

    @hookimpl
    def discover(self) -> list[Device]:
        devices = []
        for r, resource in enumerate(self.resources):
            prefix = "sim" if r == 0 else f"sim{r}-"
            for i in range(self.count):
                dev_id = f"{prefix}{i}"
                with self._lock:
                    reason = self.unhealthy.get(dev_id)
                devices.append(
                    Device(
                        id=dev_id,
                        resource=resource,
                        healthy=reason is None,
                        reason=reason or "",
                        index=i,
                        numa_nodes=(board(i) % self.numa_nodes,) if self.numa_nodes else (),
                        nodes=(DeviceNode("/dev/null", f"/dev/{dev_id}", "rw"),),
                        env={"SIM_VISIBLE_DEVICES": str(i)},
                        attributes={"product": "Simulated Accelerator", "memory": 16384},
                    )
                )
        return devices

    @hookimpl
    async def watch(self, events: EventSink) -> None:
        """Flip the first device's health every ``flip_every`` seconds; a reload that
        changes the period restarts the flipping with it (0 stops it, healthy)."""
        self.sinks.append(events)
        wake = asyncio.Event()
        entry = (asyncio.get_running_loop(), wake)
        self._wakeups.append(entry)
        first = "sim0"
        faulty = False
        loop = asyncio.get_running_loop()
        ticked = False

        def tick() -> None:
            nonlocal ticked
            ticked = True
            wake.set()

        try:
            while True:
                period = self.flip_every
                wake.clear()
                ticked = False
                # a timer, not wait_for: on 3.10/3.11 wait_for can swallow a cancellation
                timer = loop.call_later(period, tick) if period > 0 else None
                try:
                    await wake.wait()  # the period passed, or the options changed
                finally:
                    if timer is not None:
                        timer.cancel()
                if ticked and period == self.flip_every:
                    faulty = not faulty
                    if faulty:
                        self._report(events, first, False, "simulated fault")
                    else:
                        self._report(events, first, True, "simulated recovery")
                elif faulty and self.flip_every <= 0:  # flips turned off: leave it healthy
                    faulty = False
                    self._report(events, first, True, "flips turned off")
        finally:
            self._wakeups.remove(entry)
            self.sinks.remove(events)

    @hookimpl
    def links(self, devices: list[Device]) -> list[Link]:
        out = []
        for a in devices:
            for b in devices:
                if a.resource != b.resource or a.id >= b.id or a.index is None or b.index is None:
                    continue
                if board(a.index) == board(b.index):
                    out.append(Link(a.id, b.id, 60, "PIX"))
                elif a.numa_nodes == b.numa_nodes:
                    out.append(Link(a.id, b.id, 20, "NODE"))
                else:
                    out.append(Link(a.id, b.id, 10, "SYS"))
        return out

    @hookimpl
    def usage(self) -> list[ProcessUsage]:
        """The simulated processes (see ``processes``)."""
        return list(self.processes)

    # --- test controls ---------------------------------------------------

    def set_processes(self, processes: list[ProcessUsage]) -> None:
        """What the next scrapes' ``usage`` hook reports."""
        self.processes = list(processes)

    def _report(self, sink: EventSink, device_id: str, healthy: bool, reason: str) -> None:
        """Push a health event, remembered first: a rediscovery after it reports the
        same health (a real device that failed is still failed when found again)."""
        with self._lock:
            if healthy:
                self.unhealthy.pop(device_id, None)
            else:
                self.unhealthy[device_id] = reason or "unhealthy"
        sink.set_health(device_id, healthy, reason)

    def set_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        """Push a health event, as a real backend's watcher would."""
        for sink in list(self.sinks):
            self._report(sink, device_id, healthy, reason)

    def set_count(self, count: int) -> None:
        """Change how many devices exist and ask the framework to rediscover."""
        self.count = count
        for sink in list(self.sinks):
            sink.rediscover()


plugin = SimulatedBackend()
