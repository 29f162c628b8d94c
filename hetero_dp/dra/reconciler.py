"""Makes the server's slices of one pool match what the publisher wants.

Compares against :class:`~hetero_dp.dra.watch.SliceCache` (kept by the watch),
so a sync that changes nothing sends nothing, not even a LIST; it lists only
when no watch keeps the cache current, or when a write finds the cache out of
date (``409`` conflict or already-exists, ``404`` gone), and then tries once
more. A write sends the object from the cache with its ``resourceVersion``
(optimistic concurrency: the server refuses it if someone changed the slice
since), and its answer goes back into the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.renderer import normalize_spec
from hetero_dp.dra.watch import SliceCache

log = logging.getLogger(__name__)


class Pool(Protocol):
    """What the reconciler needs of the publisher."""

    generation: int

    def desired(self) -> list[dict[str, Any]]: ...

    def adopt(self, current: dict[str, dict[str, Any]]) -> None: ...


class _Stale(Exception):
    """A write found the cache out of date."""


def version_of(obj: dict[str, Any] | None) -> dict[str, Any]:
    rv = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return {"resourceVersion": rv} if rv else {}


class Reconciler:
    def __init__(
        self,
        api: ResourceAPI,
        driver: str,
        node: str,
        cache: SliceCache,
        *,
        redetect: Callable[[], bool] = lambda: False,
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.cache = cache
        self.redetect = redetect
        self.errors: dict[str, str] = {}  # slice name -> last refusal
        self.writes = 0  # creates, replaces and deletes sent
        self.lists = 0  # LISTs sent
        self.conflicts = 0

    def relist(self) -> dict[str, dict[str, Any]]:
        """LIST the pool into the cache; a 404 (version no longer served) re-detects
        the version and lists once more. The watch thread may have re-detected it
        while this LIST was in flight: then the version differs from the one asked
        with, and discovery (which shows no change any more) is not needed."""
        asked_with = self.api.version
        try:
            items, rv = self.api.list_slices_rv(self.driver, self.node)
        except APIError as e:
            if e.status != 404:
                raise
            if self.api.version == asked_with and not self.redetect():
                raise
            items, rv = self.api.list_slices_rv(self.driver, self.node)
        finally:
            self.lists += 1
        self.cache.replace(items, rv)
        return self.cache.view()

    def current(self) -> dict[str, dict[str, Any]]:
        """The pool as the server holds it: the cache while a watch keeps it, else a LIST."""
        return self.cache.view() if self.cache.live else self.relist()

    def differs(self, have: dict[str, Any] | None, want: dict[str, Any]) -> bool:
        if have is None:
            return True
        owners = (have.get("metadata") or {}).get("ownerReferences") or []
        if owners != (want["metadata"].get("ownerReferences") or []):
            return True
        return normalize_spec(have.get("spec") or {}, self.api.version) != normalize_spec(
            want["spec"], self.api.version
        )

    def reconcile(self, pool: Pool) -> list[tuple[str, str]]:
        """Runs in a worker thread; returns the refused slices as (name, reason).
        Raises :class:`APIError` when the pool cannot be read."""
        current = self.current()
        for attempt in range(2):
            pool.adopt(current)
            try:
                return self._apply(pool, current)
            except _Stale:
                self.conflicts += 1
                if attempt:
                    break
                current = self.relist()
        return [(n, e) for n, e in self.errors.items()]

    def _apply(self, pool: Pool, current: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
        refused: list[tuple[str, str]] = []
        left = dict(current)
        for want in pool.desired():
            name = want["metadata"]["name"]
            have = left.pop(name, None)
            if not self.differs(have, want):
                self.errors.pop(name, None)
                continue
            body = dict(want)
            body["metadata"] = {**want["metadata"], **version_of(have)}
            try:
                if have is None:
                    stored = self.api.create_slice(body)
                    log.debug("created ResourceSlice %s", name)
                else:
                    stored = self.api.replace_slice(name, body)
                    log.debug("replaced ResourceSlice %s", name)
                self.writes += 1
                self.cache.wrote(stored)
                self.errors.pop(name, None)
            except APIError as e:
                self.writes += 1
                if e.status in (404, 409):
                    raise _Stale from None
                if e.retriable:  # no answer or a server in trouble: the sync is retried
                    raise
                self.errors[name] = str(e)
                log.error(
                    "the API server refused ResourceSlice %s (%s, pool %s, generation %d): %s",
                    name,
                    self.driver,
                    self.node,
                    pool.generation,
                    e,
                    extra={"reason": e.message},
                )
                refused.append((name, str(e)))
        for name in left:  # left over from a larger pool or another process
            self.delete(name)
        return refused

    def delete(self, name: str) -> None:
        try:
            self.api.delete_slice(name)
            self.writes += 1
        except APIError as e:
            if e.status != 404:
                log.error("cannot delete ResourceSlice %s: %s", name, e)
                return
        self.cache.removed(name)

    def remove_all(self) -> None:
        """Delete every slice of the pool (a fresh LIST: the watch has stopped)."""
        try:
            slices = self.relist()
        except APIError as e:
            log.error("cannot list ResourceSlices to remove them: %s", e)
            return
        for name in slices:
            self.delete(name)
