"""The kubelet's limit on one ListAndWatch message, and what a device adds to one,
counted by hand as protobuf encodes it (no protobuf import): both front ends and the
sharing checks use it without depending on the device-plugin side."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hetero_dp.model.device import REPLICA_SEPARATOR, UNHEALTHY, Device

#: The most a ListAndWatch message may be: the kubelet's device-plugin client sets
#: no receive limit of its own, so gRPC's default of 4 MiB applies; a larger message
#: is never received, the stream fails and the plugin re-registers in a loop
#: (docs/sources.md#grpc-message-size: grpc-go's default, the kubelet's client.go).
MAX_LIST_AND_WATCH_BYTES = 4 * 1024 * 1024
#: The same limit holds for every answer the kubelet receives: an Allocate answer
#: larger than this never reaches it (the gRPC client refuses it).
MAX_ANSWER_BYTES = MAX_LIST_AND_WATCH_BYTES


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
