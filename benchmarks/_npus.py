"""The DRA benchmarks' backend: ``count`` NPUs with a node, an index and two
attributes each, as a small accelerator publishes them (not a bench_ module)."""

from __future__ import annotations

from hetero_dp import Device, DeviceNode, hookimpl

RES = "acme.example.com/npu"


class Npus:
    hetero_dp_name = "npus"

    def __init__(self, count: int) -> None:
        self.count = count

    @hookimpl
    def discover(self) -> list[Device]:
        return [
            Device(
                id=f"NPU-{i}",
                resource=RES,
                index=i,
                nodes=(DeviceNode(f"/dev/npu{i}"),),
                attributes={"memoryMiB": 16384, "product": "Acme N1"},
            )
            for i in range(self.count)
        ]
