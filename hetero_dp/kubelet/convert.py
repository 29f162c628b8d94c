"""Between the framework's records and the device-plugin protobuf messages."""

from __future__ import annotations

from collections.abc import Iterable

from ..device import Device
from ..response import ContainerResponse
from .api import deviceplugin_v1beta1_pb2 as pb


def device_to_pb(d: Device) -> pb.Device:
    msg = pb.Device(ID=d.id, health=d.health)
    if d.numa_nodes:
        msg.topology.nodes.extend(pb.NUMANode(ID=n) for n in d.numa_nodes)
    return msg


def list_and_watch_response(devices: Iterable[Device]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[device_to_pb(d) for d in devices])


def container_response_to_pb(r: ContainerResponse) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=r.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in r.mounts
        ],
        devices=[
            pb.DeviceSpec(
                container_path=n.container_path, host_path=n.host_path, permissions=n.permissions
            )
            for n in r.devices
        ],
        annotations=r.annotations,
        cdi_devices=[pb.CDIDevice(name=n) for n in r.cdi_devices],
    )
