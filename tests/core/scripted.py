"""A backend whose behaviour each test scripts: devices, failures, hangs."""

from __future__ import annotations

import threading
from typing import Any

from hetero_dp import ContainerResponse, Device, DeviceNode, EventSink, hookimpl


def make_devices(resource: str, count: int, *, prefix: str = "dev", numa: int = 2) -> list[Device]:
    return [
        Device(
            id=f"{prefix}{i}",
            resource=resource,
            index=i,
            numa_nodes=(i % numa,) if numa else (),
            nodes=(
                DeviceNode(f"/dev/{prefix}{i}"),
                DeviceNode("/dev/ctl", shared=True),
            ),
            env={"VISIBLE": str(i), "DRIVER": "v1"},
            annotations={f"example.com/{prefix}{i}": "yes"},
        )
        for i in range(count)
    ]


class Scripted:
    """Hooks read their behaviour from attributes tests set."""

    hetero_dp_name = "scripted"

    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices
        self.discover_error: Exception | None = None
        self.health_error: dict[str, Exception] = {}
        self.health_hang = threading.Event()  # set -> check_health blocks until released
        self.release = threading.Event()
        self.unhealthy: dict[str, str] = {}
        self.sinks: list[EventSink] = []
        self.watch_started = threading.Event()
        self.pre_started: list[list[str]] = []
        self.allocated: list[list[str]] = []

    @hookimpl
    def discover(self) -> list[Device]:
        if self.discover_error is not None:
            raise self.discover_error
        return list(self.devices)

    @hookimpl
    def check_health(self, device: Device) -> Any:
        if device.id in self.health_error:
            raise self.health_error[device.id]
        if self.health_hang.is_set():
            self.release.wait(30)
        return self.unhealthy.get(device.id, True)

    @hookimpl
    def watch(self, events: EventSink) -> None:
        self.sinks.append(events)
        self.watch_started.set()
        events.wait()

    @hookimpl
    def allocate(self, devices: list[Device], response: ContainerResponse) -> None:
        self.allocated.append([d.id for d in devices])
        response.envs["SCRIPTED_COUNT"] = str(len(devices))


class WithPreStart(Scripted):
    @hookimpl
    def pre_start_container(self, devices: list[Device]) -> None:
        self.pre_started.append([d.id for d in devices])
