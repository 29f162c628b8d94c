"""Pods the fake kubelet admitted, and the device checkpoint it writes for them.

The kubelet's device manager records each container's devices in
``kubelet_internal_checkpoint`` in the device-plugin dir
(``pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go``), JSON as kubelet 1.36
writes it: ``{"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName",
"ResourceName", "DeviceIDs": {"<NUMA node or -1>": [ids]}, "AllocResp": <base64
ContainerAllocateResponse>}], "RegisteredDevices": {resource: [ids]}}, "Checksum": n}``.
The kubelet's checksum is a hash of its Go structure's printout; the fake writes a
CRC of the data instead (readers must not trust it, and ours does not read it).
"""

from __future__ import annotations

import base64
import json
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero_dp.kits.atomic import write_atomic
from hetero_dp.model.names import CHECKPOINT_FILE


@dataclass
class FakeContainer:
    name: str
    #: resource -> the device IDs Allocate was called with
    devices: dict[str, list[str]] = field(default_factory=dict)
    #: resource -> the ContainerAllocateResponse bytes the plugin answered
    responses: dict[str, bytes] = field(default_factory=dict)


@dataclass
class FakePod:
    name: str
    namespace: str = "default"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    containers: list[FakeContainer] = field(default_factory=list)

    def device_ids(self) -> list[str]:
        return [i for c in self.containers for ids in c.devices.values() for i in ids]


def checkpoint_document(pods: list[FakePod], registered: dict[str, list[str]]) -> dict[str, Any]:
    entries = [
        {
            "PodUID": p.uid,
            "ContainerName": c.name,
            "ResourceName": resource,
            "DeviceIDs": {"-1": list(ids)},
            "AllocResp": base64.b64encode(c.responses.get(resource, b"")).decode(),
        }
        for p in pods
        for c in p.containers
        for resource, ids in c.devices.items()
    ]
    data = {"PodDeviceEntries": entries or None, "RegisteredDevices": registered}
    checksum = zlib.crc32(json.dumps(data, sort_keys=True).encode())
    return {"Data": data, "Checksum": checksum}


def write_checkpoint(
    plugin_dir: Path, pods: list[FakePod], registered: dict[str, list[str]]
) -> None:
    """Write the checkpoint as the kubelet does on every allocation change (atomically:
    the kubelet's checkpoint manager writes a temp file and renames it)."""
    doc = checkpoint_document(pods, registered)
    write_atomic(plugin_dir / CHECKPOINT_FILE, json.dumps(doc, separators=(",", ":")), 0o600)
