"""Allocate: validating requested IDs and the default response from device records."""

from __future__ import annotations

from collections.abc import Sequence

from hetero_dp.model.device import Device
from hetero_dp.model.errors import AllocationError
from hetero_dp.model.response import ContainerResponse
from hetero_dp.model.state import ResourceState

MAX_IDS_SHOWN = 8
MAX_ID_SHOWN = 80  # longer IDs are cut: the message travels in a 16 KiB gRPC trailer


def _clip(device_id: str) -> str:
    if len(device_id) <= MAX_ID_SHOWN:
        return device_id
    return f"{device_id[:MAX_ID_SHOWN]}... ({len(device_id)} characters)"


def show_ids(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(_clip(i)) for i in ids[:MAX_IDS_SHOWN])
    more = len(ids) - MAX_IDS_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def validate_ids(
    state: ResourceState, ids: Sequence[str], *, require_healthy: bool = True, what: str = "devices"
) -> list[Device]:
    """The advertised devices for ``ids``, or AllocationError naming the bad IDs.

    Empty, duplicate and unknown IDs are INVALID_ARGUMENT; unhealthy ones
    FAILED_PRECONDITION (the kubelet should never have offered them).
    """
    if not ids:
        raise AllocationError(f"{state.name}: empty request: no {what} given")
    seen: set[str] = set()
    dupes = [i for i in ids if i in seen or seen.add(i)]  # type: ignore[func-returns-value]
    if dupes:
        raise AllocationError(f"{state.name}: duplicate {what} in request: {show_ids(dupes)}")
    found = [state.get(i) for i in ids]
    unknown = [i for i, d in zip(ids, found) if d is None]
    if unknown:
        raise AllocationError(f"{state.name}: unknown {what}: {show_ids(unknown)}")
    devices = [d for d in found if d is not None]
    if require_healthy:
        sick = [d for d in devices if not d.healthy]
        if sick:
            detail = "; ".join(f"{d.id!r}: {d.reason or 'unhealthy'}" for d in sick[:MAX_IDS_SHOWN])
            raise AllocationError(
                f"{state.name}: unhealthy {what} requested: {detail}", code="FAILED_PRECONDITION"
            )
    return devices


def build_response(devices: Sequence[Device]) -> ContainerResponse:
    """The default response: every device's nodes, mounts, annotations and env.

    Nodes and mounts are de-duplicated by container path (shared nodes appear
    once); env values under one key are joined with commas in device order,
    each distinct value once.
    """
    response = ContainerResponse()
    env_values: dict[str, list[str]] = {}
    for d in devices:
        for node in d.nodes:
            response.add_device_node(node)
        for mount in d.mounts:
            response.add_mount(mount)
        for key, value in d.env.items():
            values = env_values.setdefault(key, [])
            if value not in values:
                values.append(value)
        response.annotations.update(d.annotations)
    response.envs = {k: ",".join(v) for k, v in env_values.items()}
    return response
