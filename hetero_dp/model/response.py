"""A plain, mutable Allocate response for one container, independent of protobuf.

Backends receive it in the ``allocate`` hook; the kubelet side turns it into a
``ContainerAllocateResponse``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_dp.model.device import DeviceNode, Mount


@dataclass
class ContainerResponse:
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    devices: list[DeviceNode] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)

    def copy(self) -> ContainerResponse:
        """A response whose lists and dicts may be changed without touching this one
        (the items themselves are immutable)."""
        return ContainerResponse(
            envs=dict(self.envs),
            mounts=list(self.mounts),
            devices=list(self.devices),
            annotations=dict(self.annotations),
            cdi_devices=list(self.cdi_devices),
        )

    def add_device_node(self, node: DeviceNode) -> None:
        """Add a node unless one with the same container path is there already."""
        if all(d.container_path != node.container_path for d in self.devices):
            self.devices.append(node)

    def add_mount(self, mount: Mount) -> None:
        """Add a mount unless one with the same container path is there already."""
        if all(m.container_path != mount.container_path for m in self.mounts):
            self.mounts.append(mount)
