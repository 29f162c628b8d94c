"""Keeps this node's pool of ResourceSlices in step with the device set.

:meth:`SlicePublisher.publish` takes the current devices; when their rendering
changed it bumps the pool generation, then :meth:`sync` makes the API server's
slices match: create the missing, replace the different, delete the extra.
:meth:`sync` is also what the driver runs when its watch sees the slices
change under it (the kubelet wipes a node's slices when it starts).

Three parts do the work: :mod:`.renderer` (records -> the pool's devices for
the served features), :mod:`.reconciler` (the pool on the server made to
match, against the watch's cache) and :mod:`.features` (which optional fields
the server keeps). The publisher holds the pool's state (generation, devices,
role) and schedules retries.

Following the server, not a picture of it taken once:

- *Reads through the watch.* The pool is LISTed once; the watch
  (:mod:`.watch`) keeps a cache of it, and a sync compares against the cache:
  a rediscovery, a health change or a periodic check that leaves the slices as
  they are sends nothing, not even a LIST. A write that finds the cache out of
  date (a conflict) lists once and tries again.
- *Semantic comparison.* The server stores quantities in canonical form and
  drops empty fields; a slice is rewritten only when it differs from the
  server's after both are normalised (:func:`normalize_spec`).
- *Retries.* A sync that gets no answer, a 429 or a 5xx is tried again after
  the one back-off policy (:class:`~hetero_dp.dra.client.Backoff`); while the
  watch has lost the server too, an unreachable server is left to the watch,
  which syncs when it reconnects (one stream of attempts per node, not two).
- *API version.* A ``404`` on the slice collection means the server stopped
  serving the version in use (an upgrade from ``v1beta1`` to ``v1``, or a
  rollback): the version is detected again and the sync repeated. The watch
  reads discovery whenever a stream ends early or fails (an API server being
  replaced ends its watches), so a switch is followed within a watch's
  lifetime even when nothing fails; it is also detected again every
  ``redetect_interval`` seconds (the discovery answer is shared by the drivers
  of a process). A new version that serves other optional fields re-renders the pool.
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
import time
from collections.abc import Iterable
from typing import Any

from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.client import Backoff
from hetero_dp.dra.features import FEATURES, FeatureDetector
from hetero_dp.dra.reconciler import Reconciler
from hetero_dp.dra.renderer import generation_of, normalize_spec, render_pool
from hetero_dp.dra.slices import VERSIONS, render_slices
from hetero_dp.dra.watch import SliceCache, SliceWatch
from hetero_dp.kits import observe
from hetero_dp.model.device import Device

log = logging.getLogger(__name__)

DEFAULT_REDETECT_INTERVAL = 600.0

__all__ = ["DEFAULT_REDETECT_INTERVAL", "FEATURES", "SlicePublisher", "normalize_spec"]


class SlicePublisher:
    def __init__(
        self,
        api: ResourceAPI,
        driver: str,
        node: str,
        *,
        versions: tuple[str, ...] = VERSIONS,
        redetect_interval: float = DEFAULT_REDETECT_INTERVAL,
        watched: bool = True,
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.versions = versions
        self.redetect_interval = redetect_interval
        self.generation = 0
        self.devices: list[dict[str, Any]] | None = None  # v1 shape, as last published
        self.notes: list[str] = []  # what the last rendering left out, and why
        self.syncs = 0
        # False while a newer instance of this driver publishes the pool (rolling update)
        self.active = True
        self.detector = FeatureDetector(driver)
        self.shares: dict[str, int] = {}  # DRA device name -> ways it is shared
        self.counter_sets: list[dict[str, Any]] = []
        self.owner: dict[str, str] | None = None  # the Node: {name, uid}
        self._records: list[Device] = []
        self.cache = SliceCache()
        self.cache.watched = watched
        self.reconciler = Reconciler(api, driver, node, self.cache, redetect=self.redetect)
        self.backoff = Backoff()
        self._retry: asyncio.TimerHandle | None = None
        self._rendered_with: dict[str, bool] = {}  # the features the pool was rendered for
        self._detected_at = time.monotonic()
        self._lock = asyncio.Lock()

    @property
    def version(self) -> str:
        return self.api.version

    @property
    def features(self) -> dict[str, bool]:
        return self.detector.features

    @property
    def errors(self) -> dict[str, str]:
        """Slice name -> the server's last refusal of it."""
        return self.reconciler.errors

    @property
    def writes(self) -> int:
        return self.reconciler.writes

    def watch(self, on_change: Any, **kwargs: Any) -> SliceWatch:
        """The watch that keeps this publisher's cache (not started)."""
        self.cache.watched = True
        kwargs.setdefault("rediscover", self.rediscover)
        return SliceWatch(
            self.api, self.driver, self.node, on_change=on_change, cache=self.cache, **kwargs
        )

    async def start(self) -> None:
        """LIST the pool once (the cache the watch continues from) and continue the
        pool generation from slices a previous process left."""
        # three independent reads, side by side (the client is thread-safe)
        current, _, _ = await asyncio.gather(
            asyncio.to_thread(self.reconciler.relist),
            asyncio.to_thread(self.probe_features),
            asyncio.to_thread(self._find_owner),
        )
        self.generation = max([self.generation, *(generation_of(s) for s in current.values())])
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

    def adopt(self, current: dict[str, dict[str, Any]]) -> None:
        """The server holds a newer generation (another instance during a rolling
        update, or a previous process): take it if the content is ours, else
        continue above it."""
        server_gen = max((generation_of(s) for s in current.values()), default=0)
        if server_gen <= self.generation:
            return
        self.generation = server_gen
        differs = self.reconciler.differs
        if any(differs(current.get(w["metadata"]["name"]), w) for w in self.desired()):
            self.generation = server_gen + 1
        log.info(
            "DRA pool %s of %s: the server holds generation %d; continuing at %d",
            self.node,
            self.driver,
            server_gen,
            self.generation,
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
        self._rendered_with = dict(self.features)
        r = render_pool(
            self._records, driver=self.driver, features=self.features, shares=self.shares
        )
        self._log_notes(r.notes)
        changed = r.devices != self.devices or r.counter_sets != self.counter_sets
        if changed:
            self.counter_sets = r.counter_sets
            self.devices = r.devices
            self.generation += 1
            log.info(
                "DRA pool %s of %s: generation %d with %d devices",
                self.node,
                self.driver,
                self.generation,
                len(r.devices),
            )
        await self.sync()
        return changed

    async def sync(self) -> None:
        """Make the server's slices of this pool match what was last published."""
        if self.devices is None or not self.active:
            return
        async with self._lock:
            try:
                refused = await asyncio.to_thread(self._sync_blocking)
            except APIError as e:
                log.error("cannot sync ResourceSlices of %s on %s: %s", self.driver, self.node, e)
                self._schedule_retry(e)
                return
            finally:
                self.syncs += 1
            self.backoff.reset()
        if self._rendered_with != self.features:  # a new version serves other fields
            await self.publish(self._records)
            return
        for name, reason in refused:  # observers run on the loop, not in the worker thread
            observe.emit("dra_slice_refused", driver=self.driver, slice=name, reason=reason)

    def _schedule_retry(self, e: APIError) -> None:
        """Sync again after the back-off, unless a failing watch will: a watch that
        cannot reach the server syncs when it gets through again (one stream of
        attempts per node, not two). While the watch is live the server answers it,
        so a failed write (a stale connection, a timeout) is retried here, not left
        to the periodic check."""
        if not e.retriable or self._retry is not None:
            return
        if e.status == 0 and self.cache.watched and not self.cache.live:
            return
        loop = asyncio.get_running_loop()
        self._retry = loop.call_later(self.backoff.next(), self._retry_now)

    def _retry_now(self) -> None:
        self._retry = None
        asyncio.get_running_loop().create_task(self.sync())

    def cancel_retry(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    # --- blocking part (worker thread) ------------------------------------

    def redetect(self) -> bool:
        """Detect the served version again; True when it changed."""
        try:
            return self.rediscover()
        except APIError as e:
            log.error(
                "DRA driver %s: cannot detect the resource.k8s.io version: %s", self.driver, e
            )
            return False

    def rediscover(self) -> bool:
        """Read the discovery document now (the watch does after a stream ended early
        or failed); True when the version to use changed. Raises :class:`APIError`."""
        before = self.api.version
        try:
            self.api.detect(self.versions, max_age=0)
        except APIError:
            self.api.version = before
            raise
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

    def probe_features(self) -> None:
        """Which optional fields the server keeps (:mod:`.features`; once per process)."""
        self.detector.detect(self.api, self.node)

    def _sync_blocking(self) -> list[tuple[str, str]]:
        """Runs in a worker thread; returns the refused slices as (name, reason)."""
        if time.monotonic() - self._detected_at > self.redetect_interval:
            before = self.api.version
            try:
                self.api.detect(self.versions, max_age=self.redetect_interval)
            except APIError as e:
                self.api.version = before
                log.error(
                    "DRA driver %s: cannot detect the resource.k8s.io version: %s", self.driver, e
                )
            self._detected_at = time.monotonic()
            if self.api.version != before:
                self.probe_features()
                self.cache.live = False  # the pool is read again under the new version
        return self.reconciler.reconcile(self)

    async def remove(self) -> None:
        """Delete every slice of this pool (clean shutdown)."""
        self.cancel_retry()
        async with self._lock:
            self.devices = None
            await asyncio.to_thread(self.reconciler.remove_all)
