"""The fake kubelet's device-manager bookkeeping: what it knows of each resource.

As the kubelet's device manager keeps it (docs/sources.md#device-plugin-api):
the latest device set per resource (capacity: all devices; allocatable: healthy
ones), the registrations and refusals in order, and the devices admitted pods
hold. :attr:`DeviceManager.timeline` records each change of a resource's healthy
count and :meth:`DeviceManager.take` picks the devices for a pod's admission (it
fails for good when too few devices are healthy), so upgrade tests assert on
events, not on times.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb

log = logging.getLogger(__name__)


@dataclass
class FakeDevice:
    id: str
    health: str
    numa_nodes: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        return self.health == "Healthy"


@dataclass
class FakeResource:
    """What the fake kubelet knows about one registered resource."""

    name: str
    endpoint: str
    options: pb.DevicePluginOptions
    mode: str = "classic"
    devices: dict[str, FakeDevice] = field(default_factory=dict)
    updates: int = 0
    stream_open: bool = False
    stream_ended: bool = False
    channel: grpc.aio.Channel | None = None
    stream_task: asyncio.Task[None] | None = None
    generation: int = 0
    registry_socket: str = ""
    # True while this is the kubelet's current client for the name (handler.go
    # ``clients[name]``); False once replaced by a later Register or disconnected.
    current: bool = True
    # True once the kubelet disconnected this endpoint (``PluginDisconnected``).
    stopped: bool = False
    # ListAndWatch messages received on this client's own stream (``updates`` counts
    # every message that set the name's devices, a replaced client's included)
    messages: int = 0

    @property
    def capacity(self) -> int:
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        return sum(1 for d in self.devices.values() if d.healthy)

    @property
    def healthy_ids(self) -> list[str]:
        return [d.id for d in self.devices.values() if d.healthy]


class AdmissionError(Exception):
    """The kubelet refused a pod at admission (``UnexpectedAdmissionError``): the
    pod fails for good, it is not retried."""


@dataclass(frozen=True)
class HealthPoint:
    """One change of a resource's healthy device count, as the kubelet saw it."""

    at: float  # time.monotonic()
    resource: str
    healthy: int
    why: str  # "update", "disconnect", "restart", "register"


class DeviceManager:
    """The device sets, registrations, health timeline and devices in use."""

    def __init__(self) -> None:
        self.resources: dict[str, FakeResource] = {}  # the current client per name
        self.registrations: list[tuple[str, str]] = []  # (resource, mode) in order
        self.rejections: list[str] = []
        self.timeline: list[HealthPoint] = []
        self.in_use: set[str] = set()  # device IDs admitted pods hold

    def reject(self, why: str) -> str:
        """Note a refused registration; returns ``why``."""
        self.rejections.append(why)
        log.info("fake kubelet rejected a registration: %s", why)
        return why

    def record(self, name: str, why: str) -> None:
        """Add a :class:`HealthPoint` when ``name``'s healthy count changed."""
        res = self.resources.get(name)
        healthy = res.allocatable if res is not None else 0
        last = next((p for p in reversed(self.timeline) if p.resource == name), None)
        if last is None or last.healthy != healthy:
            self.timeline.append(HealthPoint(time.monotonic(), name, healthy, why))

    def mark_unhealthy(self, res: FakeResource) -> None:
        """manager.go ``markResourceUnhealthy``: every device unhealthy, allocatable 0."""
        for d in res.devices.values():
            d.health = "Unhealthy"
        if self.resources.get(res.name) is res:
            self.record(res.name, "disconnect")

    def forget_devices(self) -> None:
        """A restarted kubelet: every resource back from the checkpoint with 0 devices."""
        for res in self.resources.values():
            res.devices.clear()
            res.generation = -1
            self.record(res.name, "restart")

    def registration_count(self, name: str) -> int:
        return sum(1 for n, _ in self.registrations if n == name)

    def healthy_counts(self, name: str, since: float = 0.0) -> list[int]:
        """The healthy device counts ``name`` went through since ``since`` (a
        ``time.monotonic()`` value), the one in force at ``since`` first."""
        points = [p for p in self.timeline if p.resource == name]
        before = [p.healthy for p in points if p.at < since]
        return before[-1:] + [p.healthy for p in points if p.at >= since]

    def zero_windows(
        self, name: str, since: float = 0.0, until: float | None = None
    ) -> list[float]:
        """The lengths in seconds of each stretch since ``since`` during which ``name``
        had no healthy device (one still open at ``until``, default now, ends there)."""
        end = time.monotonic() if until is None else until
        points = [p for p in self.timeline if p.resource == name and p.at <= end]
        out: list[float] = []
        start: float | None = None
        for p in points:
            if p.healthy == 0 and start is None:
                start = max(p.at, since)
            elif p.healthy > 0 and start is not None:
                if p.at >= since:
                    out.append(p.at - start)
                start = None
        if start is not None:
            out.append(end - start)
        return out

    def take(self, name: str, count: int) -> tuple[FakeResource, list[str]]:
        """Pick ``count`` healthy devices of ``name`` not in use and mark them used.

        Raises :class:`AdmissionError` when fewer than ``count`` devices are healthy
        (kubelet 1.32 ``manager.go`` ``devicesToAllocate``: the pod fails with
        ``UnexpectedAdmissionError``, for good) or the endpoint is stopped.
        """
        res = self.resources.get(name)
        if res is None:
            raise AdmissionError(f"{name}: unknown resource")
        free = [i for i in res.healthy_ids if i not in self.in_use]
        if len(free) < count:
            raise AdmissionError(
                f"Allocate failed due to no healthy devices present for {name} "
                f"({len(free)} healthy and free, {count} requested)"
            )
        ids = free[:count]
        if res.stopped or res.channel is None:
            raise AdmissionError(f"{name}: endpoint {res.endpoint} stopped")
        self.in_use.update(ids)
        return res, ids

    def release(self, ids: Sequence[str]) -> None:
        """The pods holding ``ids`` ended: their devices are free again."""
        self.in_use.difference_update(ids)
