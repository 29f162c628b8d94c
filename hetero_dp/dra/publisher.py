"""Keeps this node's pool of ResourceSlices in step with the device set.

:meth:`SlicePublisher.publish` takes the current devices; when their rendering
changed it bumps the pool generation, then :meth:`sync` makes the API server's
slices match: create the missing, replace the different, delete the extra.
:meth:`sync` is also the periodic check that republishes slices someone
deleted. A refusal by the API server is logged with the server's own reason
and retried on the next sync; the daemon keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.slices import render_devices, render_slices
from hetero_dp.kits import observe
from hetero_dp.model.device import Device

log = logging.getLogger(__name__)


class SlicePublisher:
    def __init__(self, api: ResourceAPI, driver: str, node: str) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.generation = 0
        self.devices: list[dict[str, Any]] | None = None  # v1 shape, as last published
        self.errors: dict[str, str] = {}  # slice name -> last refusal
        self.syncs = 0
        self._lock = asyncio.Lock()

    @property
    def version(self) -> str:
        return self.api.version

    async def start(self) -> None:
        """Continue the pool generation from slices a previous process left."""
        existing = await asyncio.to_thread(self.api.list_slices, self.driver, self.node)
        gens = [int(s.get("spec", {}).get("pool", {}).get("generation", 0)) for s in existing]
        self.generation = max([self.generation, *gens])

    def desired(self) -> list[dict[str, Any]]:
        return render_slices(
            driver=self.driver,
            node=self.node,
            devices=self.devices or [],
            generation=self.generation,
            version=self.version,
        )

    async def publish(self, devices: Iterable[Device]) -> bool:
        """Publish the healthy ``devices``; True when the pool changed (new generation)."""
        rendered = render_devices(devices)
        changed = rendered != self.devices
        if changed:
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
        if self.devices is None:
            return
        async with self._lock:
            refused = await asyncio.to_thread(self._sync_blocking, self.desired())
            self.syncs += 1
        for name, reason in refused:  # observers run on the loop, not in the worker thread
            observe.emit("dra_slice_refused", driver=self.driver, slice=name, reason=reason)

    def _sync_blocking(self, desired: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """Runs in a worker thread; returns the refused slices as (name, reason)."""
        refused: list[tuple[str, str]] = []
        try:
            current = {
                s["metadata"]["name"]: s for s in self.api.list_slices(self.driver, self.node)
            }
        except APIError as e:
            log.error("cannot list ResourceSlices of %s on %s: %s", self.driver, self.node, e)
            return refused
        for want in desired:
            name = want["metadata"]["name"]
            have = current.pop(name, None)
            try:
                if have is None:
                    self._create(want)
                elif have.get("spec") != want["spec"]:
                    body = dict(want)
                    body["metadata"] = {**want["metadata"], **_version_of(have)}
                    self.api.replace_slice(name, body)
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
            except APIError as e:
                if e.status != 404:
                    log.error("cannot delete stale ResourceSlice %s: %s", name, e)
        return refused

    def _create(self, want: dict[str, Any]) -> None:
        name = want["metadata"]["name"]
        try:
            self.api.create_slice(want)
            log.debug("created ResourceSlice %s", name)
        except APIError as e:
            if e.status != 409:  # created meanwhile: replace it instead
                raise
            have = next(
                (
                    s
                    for s in self.api.list_slices(self.driver, self.node)
                    if s["metadata"]["name"] == name
                ),
                None,
            )
            body = dict(want)
            body["metadata"] = {**want["metadata"], **(_version_of(have) if have else {})}
            self.api.replace_slice(name, body)

    async def remove(self) -> None:
        """Delete every slice of this pool (clean shutdown)."""
        async with self._lock:
            self.devices = None
            await asyncio.to_thread(self._remove_blocking)

    def _remove_blocking(self) -> None:
        try:
            slices = self.api.list_slices(self.driver, self.node)
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
