"""Which optional ResourceSlice fields the API server keeps (feature detection).

A server drops the fields of disabled feature gates without an error
(``dropDisabledFields`` in Kubernetes' ``pkg/registry/resource/resourceslice/strategy.go``),
so the only way to know is to send them and look at what comes back: a dry-run
create (``?dryRun=All``) validates and defaults an object without storing it.
The answer depends on the server and the API version only, so it is kept per
process: several drivers in one daemon, and a driver that reconnects, ask once.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.slices import render_slices
from hetero_dp.dra.validation import unwrap

log = logging.getLogger(__name__)

# feature -> (the gate that serves it, what follows when served, when not)
FEATURES = {
    "taints": (
        "device taints (DRADeviceTaints)",
        "unhealthy devices are published with a NoSchedule taint",
        "unhealthy devices are withdrawn from the pool",
    ),
    "counters": (
        "shared counters (DRAPartitionableDevices)",
        "a device and its partitions are published drawing on one counter set",
        "partitions are published as independent devices",
    ),
    "multi": (
        "consumable capacity (DRAConsumableCapacity)",
        "shared (time-sliced) devices are published with allowMultipleAllocations",
        "shared (time-sliced) devices go to one claim at a time",
    ),
}

# (server URL, API version) -> what the probe found
_probed: dict[tuple[str, str], dict[str, bool]] = {}
_probed_lock = threading.Lock()


def forget_probes(server: str | None = None) -> None:
    """Drop the per-process probe results (of one server, or all)."""
    with _probed_lock:
        for key in [k for k in _probed if server is None or k[0] == server]:
            del _probed[key]


def _probe_slice(driver: str, node: str, version: str) -> dict[str, Any]:
    device = {
        "name": "probe",
        "taints": [{"key": f"{driver}/unhealthy", "value": "probe", "effect": "NoSchedule"}],
        "consumesCounters": [{"counterSet": "probe", "counters": {"memory": {"value": "1"}}}],
        "allowMultipleAllocations": True,
        "capacity": {"memory": {"value": "2", "requestPolicy": {"default": "1"}}},
    }
    probe = render_slices(
        driver=driver, node=node, devices=[device], generation=0, version=version
    )[0]
    probe["metadata"]["name"] = f"{probe['metadata']['name'][:200]}-probe"
    return probe


def probe(api: ResourceAPI, driver: str, node: str, *, fresh: bool = False) -> dict[str, bool]:
    """Which of :data:`FEATURES` the server keeps; raises :class:`APIError`."""
    key = (api.api_client.server, api.version)
    with _probed_lock:
        known = _probed.get(key)
    if known is not None and not fresh:
        return dict(known)
    stored = api.create_slice(_probe_slice(driver, node, api.version), dry_run=True)
    devices = (stored.get("spec") or {}).get("devices") or [{}]
    kept = unwrap(devices[0], api.version)
    found = {
        "taints": bool(kept.get("taints")),
        "counters": bool(kept.get("consumesCounters")),
        "multi": bool(kept.get("allowMultipleAllocations")),
    }
    with _probed_lock:
        _probed[key] = found
    return dict(found)


class FeatureDetector:
    """One driver's view of the served features, with a log line per feature that changed."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.features: dict[str, bool] = dict.fromkeys(FEATURES, False)
        self.probed = False

    def detect(self, api: ResourceAPI, node: str) -> dict[str, bool]:
        try:
            found = probe(api, self.driver, node)
        except APIError as e:
            log.warning(
                "DRA driver %s: cannot probe the API server's optional fields (%s); "
                "publishing without device taints, shared counters and consumable capacity",
                self.driver,
                e,
            )
            found = dict.fromkeys(FEATURES, False)
        for key, (gate, yes, no) in FEATURES.items():
            if found[key] != self.features.get(key) or not self.probed:
                log.info(
                    "DRA driver %s: the API server %s: %s",
                    self.driver,
                    f"serves {gate}" if found[key] else f"does not serve {gate}",
                    yes if found[key] else no,
                )
        self.features = found
        self.probed = True
        return found
