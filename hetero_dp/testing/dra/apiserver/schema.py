"""What the stand-in API server accepts of a ResourceSlice, and how it stores it.

Slices are validated as the real server validates them: the JSON schema of
Kubernetes 1.34 (``kubernetes-validate``, strict, so ``basic`` under ``v1`` is
refused) and the server's own rules from
:mod:`hetero_dp.dra.validation` (the code the publisher checks with, written
from Kubernetes' ``validation.go``): lengths in bytes, names, counts per
device and slice, taints, counters. A number beyond int64 is a 400, as the real
server's decoder fails before validation. Stored objects look as the real server
keeps them: quantities in canonical form (``16384Mi`` comes back as ``16Gi``),
empty fields omitted, fields of feature gates not in ``features`` dropped, one
storage version converted to whichever version is asked (``v1``/``v1beta1``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

from hetero_dp.dra.validation import INT64_MAX, INT64_MIN, canonical_quantity, prune_empty, unwrap
from hetero_dp.dra.validation import slice_problems as server_slice_problems

GROUP = "resource.k8s.io"
SCHEMA_VERSION = "1.34"

FEATURES = ("DRADeviceTaints", "DRAPartitionableDevices", "DRAConsumableCapacity")


def slice_problems(
    obj: dict[str, Any],
    version: str,
    schema: str = SCHEMA_VERSION,
    features: Sequence[str] | None = None,
) -> list[str]:
    """What the API server would refuse in a ResourceSlice (``field: reason`` lines).

    The JSON schema of Kubernetes ``schema`` (with ``kubernetes-validate``,
    strict), then the server's own rules, from the one implementation the
    publisher uses too (:func:`hetero_dp.dra.validation.slice_problems`).
    """
    problems: list[str] = []
    try:
        import kubernetes_validate  # dev dependency; the semantic checks below need none

        try:
            kubernetes_validate.validate(obj, schema, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in getattr(e, "path", [])) or "<root>"
            first = str(getattr(e, "message", e)).splitlines()[0]
            problems.append(f"{path}: {first}")
    except ImportError:
        pass
    if features is not None:  # the server drops disabled-gate fields before it validates
        obj = from_v1(drop_disabled(to_v1(obj, version), features), version)
    return problems + server_slice_problems(obj, version)


def int64_problem(value: Any, path: str = "") -> str | None:
    """A JSON number the server's decoder cannot put in an int64 (it answers 400)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        return f"{path or '<root>'}: cannot unmarshal number {value} into Go value of type int64"
    if isinstance(value, dict):
        for k, v in value.items():
            p = int64_problem(v, f"{path}.{k}" if path else str(k))
            if p:
                return p
    if isinstance(value, list):
        for i, v in enumerate(value):
            p = int64_problem(v, f"{path}[{i}]")
            if p:
                return p
    return None


def to_v1(obj: dict[str, Any], version: str) -> dict[str, Any]:
    """Storage form: ``v1`` shape (the real server stores one version and converts)."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/v1"
    spec = out.get("spec") or {}
    if version == "v1beta1" and spec.get("devices"):
        spec["devices"] = [unwrap(d, "v1beta1") for d in spec["devices"]]
    return out


def from_v1(obj: dict[str, Any], version: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/{version}"
    spec = out.get("spec") or {}
    if version == "v1beta1" and spec.get("devices"):
        spec["devices"] = [
            {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
            for d in spec["devices"]
        ]
    return out


def drop_disabled(obj: dict[str, Any], features: Sequence[str]) -> dict[str, Any]:
    """The real server's ``dropDisabledFields`` (in place): fields of gates that are off."""
    spec = obj.get("spec") or {}
    if "DRAPartitionableDevices" not in features:
        spec.pop("sharedCounters", None)
    for d in spec.get("devices") or []:
        if "DRADeviceTaints" not in features:
            d.pop("taints", None)
        if "DRAPartitionableDevices" not in features:
            d.pop("consumesCounters", None)
        if "DRAConsumableCapacity" not in features:
            d.pop("allowMultipleAllocations", None)
            for c in (d.get("capacity") or {}).values():
                if isinstance(c, dict):
                    c.pop("requestPolicy", None)
    return obj


def store_form(obj: dict[str, Any], features: Sequence[str]) -> dict[str, Any]:
    """What the server keeps of a valid v1-shaped slice.

    Fields of disabled feature gates are dropped silently (the real server's
    ``dropDisabledFields``: DRADeviceTaints -> ``taints``, DRAPartitionableDevices
    -> ``sharedCounters``/``consumesCounters``, DRAConsumableCapacity ->
    ``allowMultipleAllocations``/``requestPolicy``), quantities are stored in
    canonical form (``16384Mi`` -> ``16Gi``), empty fields are omitted
    (``omitempty``), and a taint without ``timeAdded`` gets one.
    """
    spec = drop_disabled(obj, features).get("spec") or {}
    for d in spec.get("devices") or []:
        for c in (d.get("capacity") or {}).values():
            c["value"] = canonical_quantity(c["value"])
        for cc in d.get("consumesCounters") or []:
            for c in (cc.get("counters") or {}).values():
                c["value"] = canonical_quantity(c["value"])
        for t in d.get("taints") or []:
            t.setdefault("timeAdded", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    for cs in spec.get("sharedCounters") or []:
        for c in (cs.get("counters") or {}).values():
            c["value"] = canonical_quantity(c["value"])
    pruned: dict[str, Any] = prune_empty(obj)
    return pruned
