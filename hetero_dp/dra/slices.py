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
from hetero_dp.dra.validation import (
    INT64_MAX,
    INT64_MIN,
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_DEVICES_ADVANCED,
    MAX_VALUE_BYTES,
    canonical_quantity,
    device_problems,
    nbytes,
)
from hetero_dp.model.device import AttributeValue, Device
from hetero_dp.model.names import MAX_DNS_SUBDOMAIN as MAX_SUBDOMAIN

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta1")
MAX_DEVICES_PER_SLICE = MAX_DEVICES
MAX_ATTRIBUTES = MAX_ATTRIBUTES_AND_CAPACITIES
MAX_STRING = MAX_VALUE_BYTES  # bytes
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


def _attribute(value: AttributeValue) -> tuple[dict[str, Any] | None, str]:
    """(the DRA form of ``value``, or None and why it has none)."""
    if isinstance(value, bool):
        return {"bool": value}, ""
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            return None, f"integer {value} is outside int64"
        return {"int": value}, ""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None, f"{value!r} is not a number the API can hold"
        if value.is_integer():
            return _attribute(int(value))
        return {"string": repr(value)}, ""
    text = str(value)
    if nbytes(text) > MAX_STRING:
        return None, (
            f"string of {nbytes(text)} bytes ({len(text)} characters); the API server takes "
            f"at most {MAX_STRING} bytes"
        )
    version = _VERSION.match(text)
    if version:
        # "8.0" and "550.54.05" become semantic versions (8.0.0, 550.54.5), which CEL
        # compares as versions: "10.0" > "8.0" holds, as strings it does not.
        major, minor, patch = (int(p or 0) for p in version.groups())
        return {"version": f"{major}.{minor}.{patch}"}, ""
    return {"string": text}, ""


def memory_mib(device: Device) -> int | None:
    for key in MEMORY_KEYS:
        value = device.attributes.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and value > 0 and value == value:
            return int(value)
        if isinstance(value, str) and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def render_device(device: Device, notes: list[str] | None = None) -> dict[str, Any]:
    """One device in ``v1`` shape: ``{name, attributes, capacity}``.

    What cannot be published is left out, and why goes to ``notes`` (one line
    each, naming the device and the attribute): a string over 64 bytes, an
    integer outside int64, a key with no DRA name, two keys that become the same
    name, attributes beyond the 32 a device may have.
    """
    notes = [] if notes is None else notes
    attrs: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}  # DRA name -> the key it came from
    standard: dict[str, AttributeValue] = {}
    if nbytes(device.id) <= MAX_STRING:
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
    memory = memory_mib(device)
    if memory is not None and memory * 2**20 <= INT64_MAX:
        capacity["memory"] = {"value": canonical_quantity(f"{memory}Mi")}
    # Standard names first, so they survive the 32-entry limit.
    budget = MAX_ATTRIBUTES - len(capacity)
    over: list[str] = []
    for origin, source in (("", standard), ("attribute ", device.attributes)):
        for key, value in source.items():
            name = attribute_name(key)
            if name is None:
                notes.append(
                    f"device {device.id}: {origin}{key!r} left out: no valid DRA attribute "
                    "name (a C identifier of at most 32 characters) can be made of it"
                )
                continue
            rendered, why = _attribute(value)
            if rendered is None:
                notes.append(f"device {device.id}: attributes[{name}] left out: {why}")
                continue
            if name in attrs:
                if origin and sources[name] != key:
                    notes.append(
                        f"device {device.id}: attributes {sources[name]!r} and {key!r} both "
                        f"become the DRA attribute {name!r}; {key!r} left out"
                    )
                continue
            if len(attrs) >= budget:
                over.append(name)
                continue
            attrs[name] = rendered
            sources[name] = key
    if over:
        notes.append(
            f"device {device.id}: {len(over)} attributes left out ({', '.join(over)}): a "
            f"device has at most {MAX_ATTRIBUTES} attributes and capacities"
        )
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
    counter_sets: Sequence[Mapping[str, Any]] = (),
    owner: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The ResourceSlices of one pool: ``devices`` (``v1`` shape) in chunks of 128
    (64 when a device has taints or consumes counters), after the ``counter_sets``
    (KEP-4815 shared counters) in slices of their own, 8 sets each: the server
    refuses a slice with both.

    An empty pool still gets one slice with no devices, so the scheduler knows
    the node has none rather than that nothing was published. ``owner``: the
    Node's ``{name, uid}``; the slices then name it as their owner, and the
    garbage collector deletes them with the node.
    """
    if version not in VERSIONS:
        raise ValueError(f"unsupported resource.k8s.io version {version!r}")
    pool = pool or node
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    size = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES_PER_SLICE
    bodies: list[dict[str, Any]] = [
        {"sharedCounters": [dict(c) for c in counter_sets[i : i + MAX_COUNTER_SETS]]}
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS)
    ]
    chunks = [list(devices[i : i + size]) for i in range(0, len(devices), size)]
    bodies += [{"devices": [to_version(d, version) for d in chunk]} for chunk in chunks]
    if not chunks:
        bodies.append({"devices": []})
    out = []
    for i, body in enumerate(bodies):
        out.append(
            {
                "apiVersion": f"{GROUP}/{version}",
                "kind": "ResourceSlice",
                "metadata": {
                    "name": slice_name(node, driver, i),
                    **({"ownerReferences": [node_owner(owner)]} if owner else {}),
                },
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {
                        "name": pool,
                        "generation": generation,
                        "resourceSliceCount": len(bodies),
                    },
                    **body,
                },
            }
        )
    return out


def node_owner(node: Mapping[str, Any]) -> dict[str, Any]:
    """An owner reference to a Node (what the kubelet's own helper sets on slices)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node["name"],
        "uid": node["uid"],
        "controller": True,
    }


def taint_for(device: Device, key: str) -> dict[str, str]:
    """The device taint (KEP-5055) that marks an unhealthy device: ``NoSchedule``,
    or ``NoExecute`` for a device the backend reports :class:`~hetero_dp.Lost`, so
    the pods that hold it are evicted too.

    The value is the health reason cut to a label value (63 of ``[A-Za-z0-9._-]``);
    the full reason goes to the kubelet's health stream and the log.
    """
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", device.reason or "unhealthy")
    value = value.strip("-._")[:63].rstrip("-._") or "unhealthy"
    effect = "NoExecute" if device.lost else "NoSchedule"
    return {"key": key, "value": value, "effect": effect}


def render_devices(
    devices: Iterable[Device], notes: list[str] | None = None, *, taint_key: str | None = None
) -> list[dict[str, Any]]:
    """The devices in ``v1`` shape, sorted by name.

    Unhealthy devices are withdrawn, or, with ``taint_key`` (the API server keeps
    device taints), published with a ``NoSchedule`` taint under that key, so
    the scheduler places no new claim on them and the claims that hold them see why.

    Every rendered device is checked as the API server checks it
    (:func:`~hetero_dp.dra.validation.device_problems`); one it would refuse is
    left out, with a line in ``notes`` naming the device and the field, so the
    rest of the pool is still published. Two IDs that map to the same name would
    be one device to the scheduler: the second is left out, with a line naming both.
    """
    notes = [] if notes is None else notes
    out: dict[str, dict[str, Any]] = {}
    ids: dict[str, str] = {}
    for d in devices:
        if not d.healthy and not taint_key:
            continue
        rendered = render_device(d, notes)
        if not d.healthy and taint_key:
            rendered["taints"] = [taint_for(d, taint_key)]
        name = rendered["name"]
        problems = device_problems(rendered, f"device {d.id}")
        if problems:
            notes.append(
                f"device {d.id} left out, the API server would refuse it: " + "; ".join(problems)
            )
            continue
        if name in out:
            notes.append(
                f"devices {ids[name]!r} and {d.id!r} both map to the DRA device name "
                f"{name!r}; {d.id!r} left out"
            )
            continue
        out[name] = rendered
        ids[name] = d.id
    return [out[k] for k in sorted(out)]
