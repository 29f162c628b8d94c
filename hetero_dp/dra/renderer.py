"""What the pool should hold: device records -> rendered devices, counter sets and notes.

Pure functions over the records and the features the server serves
(:mod:`.features`); no API calls. :func:`normalize_spec` compares a slice by
meaning, as the server stores it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero_dp.dra.partitions import declared_partitions, partition, share
from hetero_dp.dra.slices import render_devices
from hetero_dp.dra.validation import canonical_quantity, prune_empty, unwrap
from hetero_dp.model.device import Device


def _canonical(q: Any) -> Any:
    try:
        return canonical_quantity(q)
    except (ValueError, TypeError):
        return q


def _canonical_counters(counters: Any) -> Any:
    if not isinstance(counters, dict):
        return counters
    return {
        k: ({**c, "value": _canonical(c.get("value"))} if isinstance(c, dict) else c)
        for k, c in counters.items()
    }


def normalize_spec(spec: dict[str, Any], version: str) -> dict[str, Any]:
    """A slice spec as the server would store it, for comparing by meaning.

    Quantities in canonical form (``16384Mi`` == ``16Gi``), empty fields
    dropped, devices in ``v1`` shape, and a taint's ``timeAdded`` (set by the
    server when the driver leaves it out) removed.
    """
    spec = prune_empty(spec)
    devices = []
    for d in spec.get("devices") or []:
        d = dict(unwrap(d, version))
        if isinstance(d.get("capacity"), dict):
            d["capacity"] = {
                k: ({**c, "value": _canonical(c.get("value"))} if isinstance(c, dict) else c)
                for k, c in d["capacity"].items()
            }
        if d.get("consumesCounters"):
            d["consumesCounters"] = [
                {**c, "counters": _canonical_counters(c.get("counters"))}
                for c in d["consumesCounters"]
            ]
        if d.get("taints"):
            d["taints"] = [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]
        devices.append(d)
    if devices:
        spec["devices"] = devices
    if spec.get("sharedCounters"):
        spec["sharedCounters"] = [
            {**cs, "counters": _canonical_counters(cs.get("counters"))}
            for cs in spec["sharedCounters"]
        ]
    return spec


def generation_of(obj: dict[str, Any]) -> int:
    try:
        return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)
    except (TypeError, ValueError):
        return 0


@dataclass
class Rendering:
    devices: list[dict[str, Any]]  # v1 shape
    counter_sets: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)  # what was left out, and why


def render_pool(
    records: Sequence[Device],
    *,
    driver: str,
    features: Mapping[str, bool],
    shares: Mapping[str, int],
) -> Rendering:
    """The pool's devices for the served ``features``; ``shares``: DRA device name ->
    ways it is shared (time-slicing)."""
    notes: list[str] = []
    taint_key = f"{driver}/unhealthy" if features.get("taints") else None
    counter_sets: list[dict[str, Any]] = []
    if not features.get("counters"):
        counted = declared_partitions(records)
        if counted:
            notes.append(
                f"{len(counted)} partitions (as {counted[0].id}) are not published: they "
                "are counter draws on their parent and the API server does not serve "
                "DRAPartitionableDevices; their parents are published whole"
            )
            left_out = {d.id for d in counted}
            records = [d for d in records if d.id not in left_out]
    rendered = render_devices(records, notes, taint_key=taint_key)
    if features.get("counters"):
        counter_sets = partition(records, rendered, notes)
    elif any(d.parent for d in records if d.parent in {r.id for r in records}):
        notes.append(
            "devices and their partitions (a parent in the same pool) are published as "
            "independent devices: the API server does not serve DRAPartitionableDevices, "
            "so a device and one of its partitions may go to different claims"
        )
    shared = {k: n for k, n in shares.items() if n > 1}
    if shared and features.get("multi"):
        share(rendered, shared, notes)
    elif shared:
        notes.append(
            f"sharing (time-slicing replicas) of {len(shared)} devices is not published: "
            "the API server does not serve DRAConsumableCapacity; each device goes to one "
            "claim at a time (pods can still share one ResourceClaim)"
        )
    return Rendering(rendered, counter_sets, notes)
