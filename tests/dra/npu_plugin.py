"""A one-file plugin for the CLI tests: two NPUs of acme.example.com/npu."""

from __future__ import annotations

from hetero_dp import Device, DeviceNode, hookimpl


@hookimpl
def discover() -> list[Device]:
    return [
        Device(
            id=f"NPU-{i:04x}",
            resource="acme.example.com/npu",
            index=i,
            nodes=(DeviceNode(f"/dev/npu{i}"),),
            env={"ACME_VISIBLE_DEVICES": str(i)},
            attributes={"memoryMiB": 16384},
        )
        for i in range(2)
    ]
