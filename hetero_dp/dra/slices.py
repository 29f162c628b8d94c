"""ResourceSlice rendering: device records -> ``resource.k8s.io`` objects (plain dicts).

One pool per node, named after the node. A device's attributes come from its
record (``Device.attributes``) plus what every backend has: ``id`` (the device
ID the backend uses), ``index``, ``numaNode`` and ``pciAddress``. Strings that
look like versions (``8.0``, ``550.54.15``) are published as semantic versions. Memory
(``memoryMiB`` or ``memory``, in MiB) also becomes the ``memory`` capacity, so a
claim can ask for "at least 8 GiB" with ``device.capacity[...].memory``.

``v1`` puts attributes and capacity on the device; ``v1beta1`` wraps them in
``basic`` (an API server rejects ``basic`` under ``v1``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hetero_dp.dra.names import attribute_name, device_name
from hetero_dp.model.device import AttributeValue, Device
from hetero_dp.model.names import MAX_DNS_SUBDOMAIN as MAX_SUBDOMAIN

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta1")
MAX_DEVICES_PER_SLICE = 128
MAX_ATTRIBUTES = 32  # attributes and capacities together, per device
MAX_STRING = 64
PCI_KEYS = ("pciAddress", "pcieBusID", "pciBusID", "pci_address", "pci")
MEMORY_KEYS = ("memoryMiB", "memory")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?$")
_PCI = re.compile(r"^(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def normalize_pci(address: str) -> str | None:
    """``00000000:07:00.0`` (NVML) or ``0000:07:00.0`` (sysfs) -> ``0000:07:00.0``."""
    address = address.strip()
    if not _PCI.match(address):
        return None
    parts = address.lower().split(":")
    domain = parts[0][-4:] if len(parts) == 3 else "0000"
    return f"{domain}:{parts[-2]}:{parts[-1]}"


def _attribute(value: AttributeValue) -> dict[str, Any] | None:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, float):
        return {"int": int(value)} if value.is_integer() else {"string": repr(value)}
    text = str(value)
    if len(text) > MAX_STRING:
        return None
    version = _VERSION.match(text)
    if version:
        # "8.0" and "550.54.05" become semantic versions (8.0.0, 550.54.5), which CEL
        # compares as versions: "10.0" > "8.0" holds, as strings it does not.
        major, minor, patch = (int(p or 0) for p in version.groups())
        return {"version": f"{major}.{minor}.{patch}"}
    return {"string": text}


def _memory_mib(device: Device) -> int | None:
    for key in MEMORY_KEYS:
        value = device.attributes.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and value > 0:
            return int(value)
        if isinstance(value, str) and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def render_device(device: Device) -> dict[str, Any]:
    """One device in ``v1`` shape: ``{name, attributes, capacity}``."""
    attrs: dict[str, dict[str, Any]] = {}
    standard: dict[str, AttributeValue] = {}
    if len(device.id) <= MAX_STRING:
        standard["id"] = device.id
    if device.index is not None:
        standard["index"] = device.index
    if device.numa_nodes:
        standard["numaNode"] = device.numa_nodes[0]
    for key in PCI_KEYS:
        raw = device.attributes.get(key)
        pci = normalize_pci(raw) if isinstance(raw, str) else None
        if pci:
            standard["pciAddress"] = pci
            break
    if device.parent:
        standard.setdefault("parent", device.parent)
    capacity: dict[str, dict[str, str]] = {}
    memory = _memory_mib(device)
    if memory is not None:
        capacity["memory"] = {"value": f"{memory}Mi"}
    # Standard names first, so they survive the 32-entry limit.
    budget = MAX_ATTRIBUTES - len(capacity)
    for source in (standard, device.attributes):
        for key, value in source.items():
            name = attribute_name(key)
            rendered = _attribute(value)
            if name is None or rendered is None:
                log.debug(
                    "device %s: attribute %r=%r has no DRA form; left out", device.id, key, value
                )
                continue
            if name in attrs or len(attrs) >= budget:
                continue
            attrs[name] = rendered
    out: dict[str, Any] = {"name": device_name(device.id)}
    if attrs:
        out["attributes"] = dict(sorted(attrs.items()))
    if capacity:
        out["capacity"] = capacity
    return out


def slice_name(node: str, driver: str, index: int) -> str:
    """A stable object name per (node, driver, index), a DNS subdomain."""
    name = f"{node}-{driver}-{index}"
    if len(name) <= MAX_SUBDOMAIN:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    # cut right after a '.', the head would make '.-': not a DNS subdomain
    head = name[: MAX_SUBDOMAIN - len(digest) - 1 - len(str(index)) - 1].rstrip(".")
    return f"{head}-{digest}-{index}"


def to_version(device: Mapping[str, Any], version: str) -> dict[str, Any]:
    """A ``v1``-shaped device in ``version`` shape."""
    if version == "v1":
        return dict(device)
    basic = {k: v for k, v in device.items() if k != "name"}
    return {"name": device["name"], "basic": basic}


def render_slices(
    *,
    driver: str,
    node: str,
    devices: Sequence[Mapping[str, Any]],
    generation: int,
    version: str = "v1",
    pool: str | None = None,
) -> list[dict[str, Any]]:
    """The ResourceSlices of one pool: ``devices`` (``v1`` shape) in chunks of 128.

    An empty pool still gets one slice with no devices, so the scheduler knows
    the node has none rather than that nothing was published.
    """
    if version not in VERSIONS:
        raise ValueError(f"unsupported resource.k8s.io version {version!r}")
    pool = pool or node
    chunks = [
        list(devices[i : i + MAX_DEVICES_PER_SLICE])
        for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
    ] or [[]]
    out = []
    for i, chunk in enumerate(chunks):
        out.append(
            {
                "apiVersion": f"{GROUP}/{version}",
                "kind": "ResourceSlice",
                "metadata": {"name": slice_name(node, driver, i)},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {
                        "name": pool,
                        "generation": generation,
                        "resourceSliceCount": len(chunks),
                    },
                    "devices": [to_version(d, version) for d in chunk],
                },
            }
        )
    return out


def render_devices(devices: Iterable[Device]) -> list[dict[str, Any]]:
    """The healthy devices in ``v1`` shape, sorted by name (unhealthy ones are withdrawn).

    Two IDs that map to the same name would be one device to the scheduler:
    the second is left out with an error naming both.
    """
    out: dict[str, dict[str, Any]] = {}
    ids: dict[str, str] = {}
    for d in devices:
        if not d.healthy:
            continue
        rendered = render_device(d)
        name = rendered["name"]
        if name in out:
            log.error(
                "devices %r and %r both map to the DRA device name %r; %r left out",
                ids[name],
                d.id,
                name,
                d.id,
            )
            continue
        out[name] = rendered
        ids[name] = d.id
    return [out[k] for k in sorted(out)]
