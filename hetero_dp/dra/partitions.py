"""What DRA can say that a device plugin cannot: partitions and shared devices.

**Partitionable devices** (KEP-4815, shared counters). A device whose record
names a ``parent`` that is itself a device of the same pool (a MIG instance and
its GPU) is a partition of it. The parent gets a counter set named after it
holding its memory; the parent consumes all of it and each partition its own
memory. The scheduler then never gives the whole GPU to one claim and one of
its partitions to another, and never more partitions than the memory holds.
A backend that knows finer counters says so in the records' ``consumes``
(the bundled GPU backend: one counter per MIG memory slice, so placements that
overlap conflict): the parent's ``consumes`` is then the counter set, and each
partition draws its own ``consumes`` from it instead of memory.

**Sharing** (KEP-5075, consumable capacity). A device the sharing config
replicates N times (time-slicing in device-plugin mode) is published once with
``allowMultipleAllocations: true``; each allocation consumes one of its N
``timeSlices`` by default and 1/N of its memory, so at most N claims share it.

Each is published only where the API server keeps its fields (a dry-run
create, :meth:`~hetero_dp.dra.publisher.SlicePublisher.probe_features`);
otherwise the devices are published plain and a log line says what is lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hetero_dp.dra.names import device_name
from hetero_dp.dra.slices import memory_mib
from hetero_dp.dra.validation import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    canonical_quantity,
    quantity_value,
)
from hetero_dp.model.device import Device

SHARES = "timeSlices"


def _mi(mib: int) -> dict[str, str]:
    return {"value": canonical_quantity(f"{mib}Mi")}


def partition(
    records: Sequence[Device], rendered: list[dict[str, Any]], notes: list[str]
) -> list[dict[str, Any]]:
    """Add ``consumesCounters`` to ``rendered`` (in place); return the counter sets."""
    by_id = {d.id: d for d in records}
    by_name = {d["name"]: d for d in rendered}
    children: dict[str, list[Device]] = {}
    for d in records:
        if d.parent and d.parent in by_id and d.parent != d.id:
            children.setdefault(d.parent, []).append(d)
    sets: list[dict[str, Any]] = []
    dropped: set[str] = set()
    for parent_id, parts in sorted(children.items()):
        parent = by_id[parent_id]
        if parent.consumes:
            sets.append(_declared(parent, parts, by_name, dropped, notes))
            continue
        total = memory_mib(parent)
        if total is None:
            notes.append(
                f"device {parent_id}: has partitions ({', '.join(p.id for p in parts)}) but "
                "no memory attribute to count them against; published without shared counters"
            )
            continue
        name = device_name(parent_id)
        sets.append({"name": name, "counters": {"memory": _mi(total)}})
        whole = by_name.get(name)
        if whole is not None:
            whole["consumesCounters"] = [{"counterSet": name, "counters": {"memory": _mi(total)}}]
        for p in parts:
            own = memory_mib(p)
            entry = by_name.get(device_name(p.id))
            if entry is None:
                continue
            if own is None:
                notes.append(
                    f"device {p.id}: a partition of {parent_id} without a memory attribute; "
                    f"it consumes no counters, so it may be allocated with the whole {parent_id}"
                )
                continue
            entry["consumesCounters"] = [{"counterSet": name, "counters": {"memory": _mi(own)}}]
    if dropped:
        rendered[:] = [d for d in rendered if d["name"] not in dropped]
    return sets


def declared_partitions(records: Sequence[Device]) -> list[Device]:
    """Partitions whose parent declares counters: they exist only as counter draws
    (a MIG placement created on prepare), so without counters they cannot be published."""
    counted = {d.id for d in records if d.consumes}
    return [d for d in records if d.parent in counted and d.parent != d.id]


def _counts(consumes: Mapping[str, int]) -> dict[str, dict[str, str]]:
    return {k: {"value": str(v)} for k, v in sorted(consumes.items())}


def _declared(
    parent: Device,
    parts: Sequence[Device],
    by_name: dict[str, dict[str, Any]],
    dropped: set[str],
    notes: list[str],
) -> dict[str, Any]:
    """The counter set a backend declared (``Device.consumes``) and its draws."""
    name = device_name(parent.id)
    whole = by_name.get(name)
    if whole is not None:
        whole["consumesCounters"] = [{"counterSet": name, "counters": _counts(parent.consumes)}]
    for p in parts:
        entry = by_name.get(device_name(p.id))
        if entry is None:
            continue
        unknown = sorted(set(p.consumes) - set(parent.consumes))
        if unknown or not p.consumes:
            why = (
                f"draws counters its parent does not hold ({', '.join(unknown)})"
                if unknown
                else "declares no counters to draw"
            )
            notes.append(
                f"device {p.id}: a partition of {parent.id} that {why}; left out, so it "
                f"cannot be allocated beside {parent.id} or its other partitions"
            )
            dropped.add(device_name(p.id))
            continue
        entry["consumesCounters"] = [{"counterSet": name, "counters": _counts(p.consumes)}]
    return {"name": name, "counters": _counts(parent.consumes)}


def share(rendered: list[dict[str, Any]], shares: Mapping[str, int], notes: list[str]) -> None:
    """Mark devices shared ``shares[name]`` ways (``allowMultipleAllocations``), in place."""
    for d in rendered:
        n = shares.get(d["name"], 1)
        if n < 2:
            continue
        d["allowMultipleAllocations"] = True
        capacity = d.setdefault("capacity", {})
        capacity[SHARES] = {
            "value": str(n),
            "requestPolicy": {"default": "1", "validRange": {"min": "1"}},
        }
        attrs = d.get("attributes") or {}
        if len(attrs) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
            dropped = sorted(attrs)[-1]
            del attrs[dropped]
            notes.append(
                f"device {d['name']}: attributes[{dropped}] left out to make room for the "
                f"{SHARES} capacity (at most {MAX_ATTRIBUTES_AND_CAPACITIES} in all)"
            )
        memory = capacity.get("memory")
        if memory is not None:
            each = int(quantity_value(memory["value"]) // n // 2**20)
            if each > 0:
                memory["requestPolicy"] = {
                    "default": canonical_quantity(f"{each}Mi"),
                    "validRange": {"min": canonical_quantity(f"{each}Mi")},
                }
