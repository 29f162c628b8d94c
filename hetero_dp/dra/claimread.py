"""What an allocated ResourceClaim says to this driver: the devices its allocation
results name (mapped to this node's records), its opaque configuration, and the
pods it is reserved for. Pure functions of the claim object as the API server
returns it (resource.k8s.io ResourceClaim ``status``); :mod:`.prepare` acts on them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetero_dp.model.device import Device


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    uid: str
    name: str


class ClaimError(Exception):
    """This claim cannot be prepared; the message is what the kubelet shows."""


def allocated(
    claim: Mapping[str, Any], ref: ClaimRef, driver: str, pool: str, have: Mapping[str, Device]
) -> tuple[dict[str, Device], dict[str, list[str]]]:
    """The devices of ``have`` (this node's, by DRA name) that the claim's allocation
    results for ``driver`` name, and request name -> the device names it got;
    ClaimError when it is not allocated, has no results for the driver, or names a
    device this node (``pool``) does not have."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name} is not allocated")
    results = [
        r
        for r in ((allocation.get("devices") or {}).get("results") or [])
        if r.get("driver") == driver
    ]
    if not results:
        raise ClaimError(
            f"ResourceClaim {ref.namespace}/{ref.name} has no allocation results for "
            f"driver {driver}"
        )
    chosen: dict[str, Device] = {}
    requests: dict[str, list[str]] = {}
    foreign = []
    for r in results:
        name, r_pool = str(r.get("device", "")), str(r.get("pool", ""))
        if r_pool != pool or name not in have:
            foreign.append(f"{r_pool}/{name}")
            continue
        chosen[name] = have[name]
        # "main/sub" (a prioritized-list subrequest): containers name the main request
        request = str(r.get("request", "")).partition("/")[0]
        requests.setdefault(request, [])
        if name not in requests[request]:
            requests[request].append(name)
    if foreign:
        raise ClaimError(
            f"ResourceClaim {ref.namespace}/{ref.name} was allocated devices this node "
            f"(pool {pool}) does not have: {', '.join(foreign)}"
        )
    return chosen, requests


def opaque_config(claim: Mapping[str, Any], driver: str) -> list[dict[str, Any]]:
    """``driver``'s opaque config entries of an allocated claim, class first.

    The scheduler copies the DeviceClass's and the claim's config into
    ``status.allocation.devices.config`` (``source`` FromClass/FromClaim).
    """
    entries = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "config"
    ) or []
    out = []
    for e in entries:
        opaque = e.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        out.append(
            {
                "source": e.get("source", ""),
                "requests": list(e.get("requests") or []),
                "parameters": opaque.get("parameters"),
            }
        )
    out.sort(key=lambda e: 0 if e["source"] == "FromClass" else 1)  # stable: class first
    return out


def reserved_pods(claim: Mapping[str, Any]) -> list[str]:
    """The names of the pods in a ResourceClaim's ``status.reservedFor`` (entries of
    other kinds of consumer left out; a consumer is in the claim's namespace, as the
    API reference's ResourceClaimConsumerReference says)."""
    entries = (claim.get("status") or {}).get("reservedFor") or []
    if not isinstance(entries, list):
        return []
    return sorted(
        str(e["name"])
        for e in entries
        if isinstance(e, Mapping)
        and e.get("resource") == "pods"
        and not e.get("apiGroup")
        and isinstance(e.get("name"), str)
    )
