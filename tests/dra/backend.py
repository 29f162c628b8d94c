"""A scripted backend for the DRA tests: devices, health and env set by each test."""

from __future__ import annotations

from typing import Any

from hetero_dp import Device, DeviceNode, hookimpl

RES = "acme.example.com/npu"
DRIVER = "npu.acme.example.com"


def npu(i: int, *, resource: str = RES, **attrs: Any) -> Device:
    return Device(
        id=f"NPU-{i:04x}",
        resource=resource,
        index=i,
        numa_nodes=(i % 2,),
        nodes=(DeviceNode(f"/dev/npu{i}"), DeviceNode("/dev/npu_ctl", shared=True)),
        env={"ACME_VISIBLE_DEVICES": str(i)},
        attributes={
            "product": "Acme N1",
            "memoryMiB": 16384,
            "pcieBusID": f"00000000:{0x10 + i:02x}:00.0",
            "firmware": "1.2.3",
            **attrs,
        },
    )


class Npus:
    hetero_dp_name = "npus"

    def __init__(self, count: int = 2, **attrs: Any) -> None:
        self.devices = [npu(i, **attrs) for i in range(count)]
        self.unhealthy: dict[str, str] = {}

    @hookimpl
    def discover(self) -> list[Device]:
        return list(self.devices)

    @hookimpl
    def check_health(self, device: Device) -> Any:
        return self.unhealthy.get(device.id, True)
