"""This node's ResourceSlices of one driver, read through a watch (informer-style).

:class:`SliceCache` holds the node's slices as the server has them.
:class:`SliceWatch` fills it with one LIST, then keeps it current from a
``watch=true`` stream opened at the list's ``resourceVersion`` with
``allowWatchBookmarks=true``, and calls ``on_change`` (thread-safe, from its own
thread) when someone else changed the pool, so the publisher's sync compares
against the cache without asking the server (Kubernetes docs, "API Concepts",
*Efficient detection of changes* and *Watch bookmarks*).

- A stream the server ends after ``timeoutSeconds`` is reopened from the last
  ``resourceVersion`` seen (a bookmark moves it on with no object changed), so
  an idle node makes no LIST between watches.
- A watch that ends with ``410 Gone`` / ``Expired`` ("too old resource
  version": the server no longer holds the history from there, as after an API
  server restart or an etcd restore), as an ``ERROR`` event or as the answer's
  status, is followed at once by a new LIST that replaces the cache, and the
  pool is synced: slices deleted while the driver could not see are back right
  after the server answers again. The same docs: "clients must handle the case
  by recognizing the status code 410 Gone, clearing their local cache,
  performing a new get or list operation, and starting the watch from the
  resourceVersion that was returned".
- Any other failure (no server, a broken stream) is retried with the one
  policy, :class:`~hetero_dp.dra.client.Backoff`, one connection attempt per
  try; the first stream opened after a failure syncs the pool too.
- *Following an API server switch.* A stream lives ``timeout_seconds`` to
  twice that (30-60 s by default, drawn per stream so a fleet does not reopen
  in step): a stream held open by a draining server (an upgrade replaces the
  API server; the old one keeps its watches until it exits, and sends nothing
  meanwhile) is left within a minute. A stream that ends before its time or
  breaks, a failure, a ``404`` (the version in use no longer served) and a
  ``410`` are each followed by one read of the discovery document
  (``rediscover``) before the next stream: when the served version changed,
  the pool is listed again under the new one and synced. A ``404`` is retried
  at once, not after the back-off. A stream that ran its full time asks
  nothing more than the next stream: an idle node sends one watch request a
  stream, nothing else.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.client import Backoff, Stream

log = logging.getLogger(__name__)

# a stream's lifetime is drawn from [DEFAULT_TIMEOUT, 2 * DEFAULT_TIMEOUT) seconds: it
# bounds how long a draining API server can hold the watch (see the module docstring)
DEFAULT_TIMEOUT = 30
EARLY = 0.9  # a stream that ended before this share of its time was ended by the server
# a stream resumed after a failure that brought no ERROR within this many seconds is
# taken as good, and the pool is compared (see SliceWatch._watch_once)
SETTLE = 0.2


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


class _Once:
    """Calls ``fn`` the first time it is called (from any thread), never after
    :meth:`cancel`."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._done = False

    def cancel(self) -> None:
        with self._lock:
            self._done = True

    def __call__(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._fn()


class SliceCache:
    """The pool's slices as the server holds them, and this process's own writes.

    A write's answer is laid over the watched state until the watch brings the
    same ``resourceVersion`` (or, for a delete, the ``DELETED`` event), so a
    sync right after a write never sees the state from before it; events arrive
    in order, so an event for that slice seen before its own write's event is an
    older one and is kept under the overlay.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._seen: collections.deque[str] = collections.deque(maxlen=256)
        self._objects: dict[str, dict[str, Any]] = {}
        self._written: dict[str, str | None] = {}  # name -> rv of our write; None: deleted
        self._overlay: dict[str, dict[str, Any]] = {}
        self.resource_version = ""
        # True while the cache can stand for the server: listed, and a watch keeps it
        # current (``watched``: a watch runs or is about to, so a LIST makes it live)
        self.live = False
        self.watched = False
        self.lists = 0

    def replace(self, items: list[dict[str, Any]], resource_version: str) -> None:
        """The answer of a LIST: the whole pool."""
        with self._lock:
            self._objects = {str(_meta(o).get("name")): o for o in items}
            self._written.clear()
            self._overlay.clear()
            self.resource_version = resource_version
            self.lists += 1
            self.live = self.watched

    def apply(self, kind: str, obj: dict[str, Any]) -> bool:
        """A watch event; True when it is not the echo of this process's own write."""
        meta = _meta(obj)
        name, rv = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
        with self._lock:
            if rv:
                self.resource_version = rv
                self._seen.append(rv)
                self._lock.notify_all()
            if kind == "BOOKMARK" or not name:
                return False
            if kind == "DELETED":
                self._objects.pop(name, None)
            else:
                self._objects[name] = obj
            if name in self._written:
                mine = self._written[name]
                if (kind == "DELETED" and mine is None) or (mine is not None and mine == rv):
                    del self._written[name]
                    self._overlay.pop(name, None)
                    return False
            return True

    def wrote(self, obj: dict[str, Any]) -> None:
        """The server's answer to a create or replace this process sent."""
        meta = _meta(obj)
        name, rv = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
        with self._lock:
            seen = self._objects.get(name)
            listed = seen is not None and str(_meta(seen).get("resourceVersion")) == rv
            # the watch was quicker: this write's own event (and whatever came after
            # it, a delete by the kubelet's wipe say) is applied already
            if listed or rv in self._seen:
                self._written.pop(name, None)
                self._overlay.pop(name, None)
                return
            self._written[name] = rv
            self._overlay[name] = obj

    def removed(self, name: str) -> None:
        """This process deleted ``name`` (or found it gone)."""
        with self._lock:
            if name in self._objects:
                self._written[name] = None
            self._overlay.pop(name, None)

    def wait_seen(self, resource_version: str, timeout: float) -> bool:
        """Block until the watch brought ``resource_version`` (for tests); True if it did."""
        with self._lock:
            return self._lock.wait_for(lambda: resource_version in self._seen, timeout)

    def view(self) -> dict[str, dict[str, Any]]:
        """Name -> slice, as the server holds it after every write answered so far."""
        with self._lock:
            out = dict(self._objects)
            for name, mine in self._written.items():
                if mine is None:
                    out.pop(name, None)
                elif name in self._overlay:
                    out[name] = self._overlay[name]
            return copy.deepcopy(out)


class SliceWatch:
    def __init__(
        self,
        api: ResourceAPI,
        driver: str,
        node: str,
        *,
        on_change: Callable[[str], None],
        cache: SliceCache | None = None,
        timeout_seconds: int = DEFAULT_TIMEOUT,
        backoff: Backoff | None = None,
        rediscover: Callable[[], bool] | None = None,
        rand: Callable[[], float] = random.random,
        settle: float = SETTLE,
    ) -> None:
        self.api = api
        self.settle = settle  # see _watch_once
        self.driver = driver
        self.node = node
        self.on_change = on_change
        self.cache = cache if cache is not None else SliceCache()
        self.timeout_seconds = timeout_seconds
        self.backoff = backoff or Backoff()  # its cap bounds when a driver looks again
        # reads discovery; True when the served version changed (raises APIError)
        self.rediscover = rediscover
        self.rand = rand
        self.rediscoveries = 0  # discovery reads after a stream ended early or failed
        self.events = 0  # events received (for tests and metrics)
        self.relists = 0  # LISTs after an expired watch
        self.opened = 0  # watch streams opened
        self._stop = threading.Event()
        self._stream: Stream | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"dra watch {self.driver}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end and cut its open stream (it is not waited for)."""
        self._stop.set()
        self.cache.live = False
        stream = self._stream
        if stream is not None:
            stream.shutdown()

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end; True when it did."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _list(self) -> None:
        items, rv = self.api.list_slices_rv(self.driver, self.node)
        self.cache.replace(items, rv)

    def _run(self) -> None:
        # "" or "0" as a watch's start means "any": not a point to continue from
        need_list = self.cache.resource_version in ("", "0")
        failed = need_list
        ask = False  # read discovery before the next stream (the last one ended early)
        # discovery was read since the last stream that ended without an error: one read
        # covers a chain of failures (a cut stream, then 410 from the new server)
        asked = False
        while not self._stop.is_set():
            try:
                if ask and not asked and self.rediscover is not None:
                    self.rediscoveries += 1
                    if self.rediscover():  # a new version: the pool is read under it
                        need_list = True
                    asked = True
                ask = False
                listed = need_list
                if need_list:
                    self._list()
                    need_list = False
                    failed = True  # the cache was replaced: sync against it
                full = self._watch_once(failed, listed=listed)
                ask, asked = not full, False
                failed = False
                self.backoff.reset()
            except APIError as e:
                self.cache.live = False
                if self._stop.is_set():
                    return
                ask = True
                if e.status == 404:  # the version in use is gone: read discovery again
                    asked = False
                if e.expired:
                    log.info(
                        "DRA driver %s: the watch on ResourceSlices expired (%s); listing again",
                        self.driver,
                        e.message or e.reason,
                    )
                    self.relists += 1
                    need_list = True
                    continue
                failed = True
                if e.status == 404:  # the version in use is gone: discovery at once
                    self.on_change(f"watch failed: {e}")
                    need_list = True
                    if self.backoff.failures == 0:
                        self.backoff.failures = 1
                        continue
                delay = self.backoff.next()
                log.warning(
                    "DRA driver %s: watching ResourceSlices failed (%s); retrying in %.1fs",
                    self.driver,
                    e,
                    delay,
                )
                self._stop.wait(delay)
            except Exception as e:  # a broken stream: reopen it
                self.cache.live = False
                if self._stop.is_set():
                    return
                failed = True
                ask = True
                log.debug("DRA driver %s: watch stream ended: %r", self.driver, e)
                self._stop.wait(self.backoff.next())

    def _watch_once(self, resync: bool, *, listed: bool = False) -> bool:
        """One stream, read to its end; True when it ran its full time (the server
        ended it at ``timeoutSeconds``), False when it ended early.

        ``resync``: the first stream after a list or a failure, so the pool is
        compared once. Right after a LIST that is at once. A stream *resumed* after a
        failure may be refused by its first line (an ``ERROR`` event: 410 after an API
        server restart), and a sync asked before it would compare with the cache from
        before the outage or LIST beside the relist that follows the 410 (two LISTs
        per node as the server comes back): it is asked with the first event, when
        the stream ends, or after ``settle`` seconds (:data:`SETTLE`) of quiet, whichever
        is first."""
        timeout = int(self.timeout_seconds * (1.0 + self.rand()))
        started = time.monotonic()
        stream = self.api.watch_slices(self.driver, self.node, self.cache.resource_version, timeout)
        self._stream = stream
        self.opened += 1
        ask = _Once(lambda: self.on_change("watch (re)opened"))
        quiet: threading.Timer | None = None
        try:
            if self._stop.is_set():
                return True
            self.cache.live = True
            if resync and listed:  # the cache was just listed: compare once, now
                ask()
            elif resync:
                quiet = threading.Timer(self.settle, ask)
                quiet.daemon = True
                quiet.start()
            for line in stream.lines():
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    ask.cancel()  # the stream is refused: what follows syncs
                self._handle(event)
                if resync:
                    ask()
                if self._stop.is_set():
                    break
            if resync and not self._stop.is_set():
                ask()  # ended with no event: the stream was good
        finally:
            if quiet is not None:
                quiet.cancel()
            self._stream = None
            with contextlib.suppress(Exception):
                stream.close()
        return time.monotonic() - started >= EARLY * timeout

    def _handle(self, event: dict[str, Any]) -> None:
        kind = event.get("type", "")
        obj = event.get("object") or {}
        if kind == "ERROR":
            status = int(obj.get("code") or 0)
            raise APIError(status, str(obj.get("reason", "")), str(obj.get("message", "")))
        self.events += 1
        if self.cache.apply(kind, obj):
            name = _meta(obj).get("name", "?")
            log.debug("DRA driver %s: ResourceSlice %s %s", self.driver, name, kind.lower())
            self.on_change(f"ResourceSlice {name} {kind.lower()}")
