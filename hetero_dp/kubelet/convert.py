"""Between the framework's records and the device-plugin protobuf messages."""

from __future__ import annotations

from collections.abc import Iterable

from hetero_dp.kubelet.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.model.device import Device
from hetero_dp.model.response import ContainerResponse


def device_to_pb(d: Device) -> pb.Device:
    msg = pb.Device(ID=d.id, health=d.health)
    if d.numa_nodes:
        msg.topology.nodes.extend(pb.NUMANode(ID=n) for n in d.numa_nodes)
    return msg


def list_and_watch_response(devices: Iterable[Device]) -> pb.ListAndWatchResponse:
    # Built in place with add(): about 3.5x faster than constructing each pb.Device
    # and copying it in (1,000 devices: ~10 ms -> ~3 ms, benchmarks/bench_core.py).
    msg = pb.ListAndWatchResponse()
    add = msg.devices.add
    for d in devices:
        item = add(ID=d.id, health=d.health)
        for n in d.numa_nodes:
            item.topology.nodes.add(ID=n)
    return msg


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
