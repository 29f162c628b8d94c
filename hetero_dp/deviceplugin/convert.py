"""Between the framework's records and the device-plugin protobuf messages."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.model.device import REPLICA_SEPARATOR, UNHEALTHY, Device
from hetero_dp.model.response import ContainerResponse

log = logging.getLogger(__name__)

#: The most a ListAndWatch message may be: the kubelet's device-plugin client sets
#: no receive limit of its own, so gRPC's default of 4 MiB applies; a larger message
#: is never received, the stream fails and the plugin re-registers in a loop
#: (docs/sources.md#grpc-message-size: grpc-go's default, the kubelet's client.go).
MAX_LIST_AND_WATCH_BYTES = 4 * 1024 * 1024


def _varint_size(n: int) -> int:
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def _field_size(payload: int) -> int:
    """A length-delimited field (tag < 16, so one byte) of ``payload`` bytes."""
    return 1 + _varint_size(payload) + payload


def device_entry_size(id_bytes: int, numa_nodes: Sequence[int] = ()) -> int:
    """Bytes one device adds to a ListAndWatchResponse, as protobuf encodes it
    (``deviceplugin/v1beta1/api.proto``: Device{1: ID, 2: health, 3: topology{1:
    nodes{1: int64 ID}}}), counted for the longer health word, ``Unhealthy``."""
    body = _field_size(id_bytes) + _field_size(len(UNHEALTHY))
    if numa_nodes:
        # a node 0 is an empty NUMANode message (proto3 leaves a zero out)
        nodes = sum(_field_size(1 + _varint_size(n) if n else 0) for n in numa_nodes)
        body += _field_size(nodes)
    return _field_size(body)


def replicas_size(id_bytes: int, numa_nodes: Sequence[int], replicas: int) -> int:
    """What :func:`device_entry_size` sums to for replicas ``<id>::0`` ...
    ``<id>::<replicas-1>`` of one device, computed per digit count, so a huge
    ``replicas`` costs nothing to check."""
    total, low, digits = 0, 0, 1
    while low < replicas:
        high = min(replicas, 10**digits)
        entry = device_entry_size(id_bytes + len(REPLICA_SEPARATOR) + digits, numa_nodes)
        total += (high - low) * entry
        low, digits = high, digits + 1
    return total


def list_and_watch_size(devices: Iterable[Device]) -> int:
    """The most a ListAndWatchResponse of ``devices`` can be (every one Unhealthy)."""
    return sum(device_entry_size(len(d.id.encode()), d.numa_nodes) for d in devices)


def check_list_and_watch_size(msg: pb.ListAndWatchResponse, resource: str = "") -> bool:
    """Log an error if ``msg`` is over the kubelet's limit; False then.

    Rediscovery can grow a resource past the limit after start-up checked it: the
    kubelet would only see its stream fail, so the log says why."""
    size = msg.ByteSize()
    if size <= MAX_LIST_AND_WATCH_BYTES:
        return True
    log.error(
        "the ListAndWatch message of %d devices is %d bytes, over the kubelet's limit of "
        "%d bytes: the kubelet will not receive it and will not see these devices; "
        "advertise fewer devices or replicas, or shorter IDs",
        len(msg.devices),
        size,
        MAX_LIST_AND_WATCH_BYTES,
        extra={"resource": resource},
    )
    return False


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
    resource = ""
    for d in devices:
        resource = d.resource
        item = add(ID=d.id, health=d.health)
        for n in d.numa_nodes:
            item.topology.nodes.add(ID=n)
    check_list_and_watch_size(msg, resource)
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
