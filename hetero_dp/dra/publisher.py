"""Keeps this node's pool of ResourceSlices in step with the device set.

:meth:`SlicePublisher.publish` takes the current devices; when their rendering
changed it bumps the pool generation, then :meth:`sync` makes the API server's
slices match: create the missing, replace the different, delete the extra.
:meth:`sync` is also what the driver runs when its watch sees the slices
change under it (the kubelet wipes a node's slices when it starts).

Following the server, not a picture of it taken once:

- *Semantic comparison.* The server stores quantities in canonical form and
  drops empty fields; a slice is rewritten only when it differs from the
  server's after both are normalised (:func:`normalize_spec`), so a sync that
  changes nothing sends nothing.
- *API version.* A ``404`` on the slice collection means the server stopped
  serving the version in use (an upgrade from ``v1beta1`` to ``v1``, or a
  rollback): the version is detected again and the sync repeated. It is also
  detected again every ``redetect_interval`` seconds.
- *Generation.* It never goes backwards: when the server holds a newer
  generation of the pool (written by another instance of the driver during a
  rolling update), the next write continues above it.

A refusal by the API server is logged with the server's own reason and
retried on the next sync; the daemon keeps serving. What cannot be published
(a device the server would refuse, an attribute over its limits) is left out
with one log line naming the device and the field, logged when it first appears.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.partitions import declared_partitions, partition, share
from hetero_dp.dra.slices import VERSIONS, render_devices, render_slices
from hetero_dp.dra.validation import canonical_quantity, prune_empty, unwrap
from hetero_dp.kits import observe
from hetero_dp.model.device import Device

log = logging.getLogger(__name__)

DEFAULT_REDETECT_INTERVAL = 600.0
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


def _generation(obj: dict[str, Any]) -> int:
    try:
        return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)
    except (TypeError, ValueError):
        return 0


class SlicePublisher:
    def __init__(
        self,
        api: ResourceAPI,
        driver: str,
        node: str,
        *,
        versions: tuple[str, ...] = VERSIONS,
        redetect_interval: float = DEFAULT_REDETECT_INTERVAL,
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.versions = versions
        self.redetect_interval = redetect_interval
        self.generation = 0
        self.devices: list[dict[str, Any]] | None = None  # v1 shape, as last published
        self.errors: dict[str, str] = {}  # slice name -> last refusal
        self.notes: list[str] = []  # what the last rendering left out, and why
        self.syncs = 0
        # False while a newer instance of this driver publishes the pool (rolling update)
        self.active = True
        # Optional fields the server keeps (probe_features): taints (KEP-5055),
        # counters (KEP-4815 partitionable devices), multi (KEP-5075 consumable capacity)
        self.features: dict[str, bool] = dict.fromkeys(FEATURES, False)
        self.probed = False
        self.shares: dict[str, int] = {}  # DRA device name -> ways it is shared
        self.counter_sets: list[dict[str, Any]] = []
        self.owner: dict[str, str] | None = None  # the Node: {name, uid}
        self._records: list[Device] = []
        self.writes = 0  # creates, replaces and deletes sent
        self.own_versions: set[str] = set()  # resourceVersions this publisher wrote
        self._rv_lock = threading.Lock()
        self._detected_at = time.monotonic()
        self._lock = asyncio.Lock()

    @property
    def version(self) -> str:
        return self.api.version

    async def start(self) -> None:
        """Continue the pool generation from slices a previous process left."""
        existing = await asyncio.to_thread(self.api.list_slices, self.driver, self.node)
        self.generation = max([self.generation, *(_generation(s) for s in existing)])
        await asyncio.to_thread(self.probe_features)
        await asyncio.to_thread(self._find_owner)
        self._detected_at = time.monotonic()

    def _find_owner(self) -> None:
        """The Node's UID, so the pool is deleted with the node (RBAC: get nodes)."""
        if self.owner is not None:
            return
        try:
            node = self.api.read_node(self.node)
        except APIError as e:
            log.warning(
                "DRA driver %s: cannot read Node %s (%s); its ResourceSlices get no owner "
                "reference, so a node deleted while the driver is down leaves them behind",
                self.driver,
                self.node,
                e,
            )
            return
        uid = (node.get("metadata") or {}).get("uid")
        if uid:
            self.owner = {"name": self.node, "uid": uid}

    def desired(self) -> list[dict[str, Any]]:
        return render_slices(
            driver=self.driver,
            node=self.node,
            devices=self.devices or [],
            generation=self.generation,
            version=self.version,
            counter_sets=self.counter_sets,
            owner=self.owner,
        )

    def _log_notes(self, notes: list[str]) -> None:
        seen = set(self.notes)
        for note in notes:
            if note not in seen:
                level = logging.ERROR if " left out, the API server" in note else logging.WARNING
                log.log(level, "DRA driver %s: %s", self.driver, note, extra={"reason": note})
        self.notes = notes

    async def publish(self, devices: Iterable[Device]) -> bool:
        """Publish the healthy ``devices``; True when the pool changed (new generation)."""
        self._records = list(devices)
        notes: list[str] = []
        taint_key = f"{self.driver}/unhealthy" if self.features["taints"] else None
        records = self._records
        counter_sets: list[dict[str, Any]] = []
        if not self.features["counters"]:
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
        if self.features["counters"]:
            counter_sets = partition(records, rendered, notes)
        elif any(d.parent for d in records if d.parent in {r.id for r in records}):
            notes.append(
                "devices and their partitions (a parent in the same pool) are published as "
                "independent devices: the API server does not serve DRAPartitionableDevices, "
                "so a device and one of its partitions may go to different claims"
            )
        shared = {k: n for k, n in self.shares.items() if n > 1}
        if shared and self.features["multi"]:
            share(rendered, shared, notes)
        elif shared:
            notes.append(
                f"sharing (time-slicing replicas) of {len(shared)} devices is not published: "
                "the API server does not serve DRAConsumableCapacity; each device goes to one "
                "claim at a time (pods can still share one ResourceClaim)"
            )
        self._log_notes(notes)
        changed = rendered != self.devices or counter_sets != self.counter_sets
        if changed:
            self.counter_sets = counter_sets
            self.devices = rendered
            self.generation += 1
            log.info(
                "DRA pool %s of %s: generation %d with %d devices",
                self.node,
                self.driver,
                self.generation,
                len(rendered),
            )
        await self.sync()
        return changed

    async def sync(self) -> None:
        """Make the server's slices of this pool match what was last published."""
        if self.devices is None or not self.active:
            return
        async with self._lock:
            features = dict(self.features)
            refused = await asyncio.to_thread(self._sync_blocking)
            self.syncs += 1
        if features != self.features:  # a new API version (re-detected) serves other fields
            await self.publish(self._records)
            return
        for name, reason in refused:  # observers run on the loop, not in the worker thread
            observe.emit("dra_slice_refused", driver=self.driver, slice=name, reason=reason)

    # --- blocking part (worker thread) ------------------------------------

    def redetect(self) -> bool:
        """Detect the served version again; True when it changed."""
        before = self.api.version
        try:
            self.api.detect(self.versions)
        except APIError as e:
            self.api.version = before
            log.error(
                "DRA driver %s: cannot detect the resource.k8s.io version: %s", self.driver, e
            )
            return False
        self._detected_at = time.monotonic()
        if self.api.version != before:
            self.probe_features()
            log.warning(
                "DRA driver %s: the API server now serves resource.k8s.io/%s (was %s); "
                "publishing with %s",
                self.driver,
                self.api.version,
                before,
                self.api.version,
            )
            return True
        return False

    def _list(self) -> list[dict[str, Any]]:
        """The pool's slices; a 404 (version no longer served) re-detects and retries once."""
        if time.monotonic() - self._detected_at > self.redetect_interval:
            self.redetect()
        try:
            return self.api.list_slices(self.driver, self.node)
        except APIError as e:
            if e.status != 404 or not self.redetect():
                raise
        return self.api.list_slices(self.driver, self.node)

    def _record(self, obj: dict[str, Any]) -> None:
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            with self._rv_lock:
                self.own_versions.add(str(rv))
                if len(self.own_versions) > 1000:
                    self.own_versions.clear()
                    self.own_versions.add(str(rv))

    def is_own(self, resource_version: str) -> bool:
        with self._rv_lock:
            return resource_version in self.own_versions

    def probe_features(self) -> None:
        """Ask the server (a dry-run create) which optional fields it keeps.

        A server drops the fields of disabled feature gates without an error, so
        the only way to know is to send them and look at what comes back; a dry
        run stores nothing. One line in the log per feature says what follows.
        """
        probe_device = {
            "name": "probe",
            "taints": [
                {"key": f"{self.driver}/unhealthy", "value": "probe", "effect": "NoSchedule"}
            ],
            "consumesCounters": [{"counterSet": "probe", "counters": {"memory": {"value": "1"}}}],
            "allowMultipleAllocations": True,
            "capacity": {"memory": {"value": "2", "requestPolicy": {"default": "1"}}},
        }
        probe = render_slices(
            driver=self.driver,
            node=self.node,
            devices=[probe_device],
            generation=0,
            version=self.version,
        )[0]
        probe["metadata"]["name"] = f"{probe['metadata']['name'][:200]}-probe"
        try:
            stored = self.api.create_slice(probe, dry_run=True)
            devices = (stored.get("spec") or {}).get("devices") or [{}]
            kept = unwrap(devices[0], self.version)
            found = {
                "taints": bool(kept.get("taints")),
                "counters": bool(kept.get("consumesCounters")),
                "multi": bool(kept.get("allowMultipleAllocations")),
            }
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

    def _differs(self, have: dict[str, Any] | None, want: dict[str, Any]) -> bool:
        if have is None:
            return True
        owners = (have.get("metadata") or {}).get("ownerReferences") or []
        if owners != (want["metadata"].get("ownerReferences") or []):
            return True
        return normalize_spec(have.get("spec") or {}, self.version) != normalize_spec(
            want["spec"], self.version
        )

    def _sync_blocking(self) -> list[tuple[str, str]]:
        """Runs in a worker thread; returns the refused slices as (name, reason)."""
        refused: list[tuple[str, str]] = []
        try:
            listed = self._list()
        except APIError as e:
            log.error("cannot list ResourceSlices of %s on %s: %s", self.driver, self.node, e)
            return refused
        current = {s["metadata"]["name"]: s for s in listed}
        server_gen = max((_generation(s) for s in listed), default=0)
        if server_gen > self.generation:
            # Another instance (a rolling update) or a previous process wrote a newer
            # generation: take it if the content is ours, else continue above it.
            self.generation = server_gen
            if any(self._differs(current.get(w["metadata"]["name"]), w) for w in self.desired()):
                self.generation = server_gen + 1
            log.info(
                "DRA pool %s of %s: the server holds generation %d; continuing at %d",
                self.node,
                self.driver,
                server_gen,
                self.generation,
            )
        for want in self.desired():
            name = want["metadata"]["name"]
            have = current.pop(name, None)
            if not self._differs(have, want):
                self.errors.pop(name, None)
                continue
            try:
                if have is None:
                    self._create(want)
                else:
                    body = dict(want)
                    body["metadata"] = {**want["metadata"], **_version_of(have)}
                    self._record(self.api.replace_slice(name, body))
                    self.writes += 1
                    log.debug("replaced ResourceSlice %s", name)
                self.errors.pop(name, None)
            except APIError as e:
                self.errors[name] = str(e)
                log.error(
                    "the API server refused ResourceSlice %s (%s, pool %s, generation %d): %s",
                    name,
                    self.driver,
                    self.node,
                    self.generation,
                    e,
                    extra={"reason": e.message},
                )
                refused.append((name, str(e)))
        for name in current:  # left over from a larger pool or another process
            try:
                self.api.delete_slice(name)
                self.writes += 1
            except APIError as e:
                if e.status != 404:
                    log.error("cannot delete stale ResourceSlice %s: %s", name, e)
        return refused

    def _create(self, want: dict[str, Any]) -> None:
        name = want["metadata"]["name"]
        try:
            self._record(self.api.create_slice(want))
            self.writes += 1
            log.debug("created ResourceSlice %s", name)
        except APIError as e:
            if e.status != 409:  # created meanwhile: replace it instead
                raise
            have = next((s for s in self._list() if s["metadata"]["name"] == name), None)
            body = dict(want)
            body["metadata"] = {**want["metadata"], **(_version_of(have) if have else {})}
            self._record(self.api.replace_slice(name, body))
            self.writes += 1

    async def remove(self) -> None:
        """Delete every slice of this pool (clean shutdown)."""
        async with self._lock:
            self.devices = None
            await asyncio.to_thread(self._remove_blocking)

    def _remove_blocking(self) -> None:
        try:
            slices = self._list()
        except APIError as e:
            log.error("cannot list ResourceSlices to remove them: %s", e)
            return
        for s in slices:
            try:
                self.api.delete_slice(s["metadata"]["name"])
            except APIError as e:
                if e.status != 404:
                    log.error("cannot delete ResourceSlice %s: %s", s["metadata"]["name"], e)


def _version_of(obj: dict[str, Any]) -> dict[str, Any]:
    rv = obj.get("metadata", {}).get("resourceVersion")
    return {"resourceVersion": rv} if rv else {}
