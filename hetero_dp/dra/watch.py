"""A watch on this node's ResourceSlices of one driver, so a wipe is repaired at once.

The kubelet deletes a node's slices when it starts (and an admin or a
controller may delete or edit them); a periodic check notices that only at its
next round, and the node advertises nothing meanwhile. :class:`SliceWatch`
keeps a ``watch=true`` list open in a thread of its own and calls
``on_change`` (thread-safe, from that thread) when a slice of the pool is
deleted, or added or modified by someone else (a write whose
``resourceVersion`` the publisher did not get back from its own call).

The stream ends after ``timeout_seconds`` (the server ends it too) and is
reopened from the last ``resourceVersion`` seen; on an error it is reopened
after a back-off, and ``on_change`` is called, so the driver's sync looks (a
``404`` there re-detects the served API version).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from hetero_dp.dra.api import APIError, ResourceAPI

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 300
MAX_BACKOFF = 10.0


class SliceWatch:
    def __init__(
        self,
        api: ResourceAPI,
        driver: str,
        node: str,
        *,
        on_change: Callable[[str], None],
        is_own: Callable[[str], bool],
        timeout_seconds: int = DEFAULT_TIMEOUT,
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.on_change = on_change
        self.is_own = is_own
        self.timeout_seconds = timeout_seconds
        self.events = 0  # events received (for tests and metrics)
        self._stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"dra watch {self.driver}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end and cut its open stream (it is not waited for)."""
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # unblocks the read; the thread closes the connection

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end; True when it did."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        resource_version = ""
        backoff = 0.5
        while not self._stop.is_set():
            try:
                resource_version = self._watch_once(resource_version)
                backoff = 0.5
            except APIError as e:
                if self._stop.is_set():
                    return
                if e.status == 410:  # expired: start over from the current state
                    resource_version = ""
                    continue
                log.warning(
                    "DRA driver %s: watching ResourceSlices failed (%s); retrying in %.1fs",
                    self.driver,
                    e,
                    backoff,
                )
                self.on_change(f"watch failed: {e}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
            except Exception as e:  # a broken stream: reopen it
                if self._stop.is_set():
                    return
                log.debug("DRA driver %s: watch stream ended: %r", self.driver, e)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _watch_once(self, resource_version: str) -> str:
        response = self.api.watch_slices(
            self.driver, self.node, resource_version, self.timeout_seconds
        )
        self._response = response
        complete = False
        try:
            if self._stop.is_set():
                return resource_version
            buffer = b""
            for chunk in response.stream(4096, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        resource_version = self._handle(json.loads(line)) or resource_version
                if self._stop.is_set():
                    break
            else:
                complete = True
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                # A stream cut short leaves unread chunks on the connection: closed, not
                # pooled, or the next request on it reads them as its status line.
                if not complete:
                    response.close()
                response.release_conn()
        return resource_version

    def _handle(self, event: dict[str, Any]) -> str:
        kind = event.get("type", "")
        obj = event.get("object") or {}
        if kind == "ERROR":
            status = int(obj.get("code") or 0)
            raise APIError(status, str(obj.get("reason", "")), str(obj.get("message", "")))
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        self.events += 1
        name = (obj.get("metadata") or {}).get("name", "?")
        if kind == "DELETED" or (kind in ("ADDED", "MODIFIED") and not self.is_own(rv)):
            log.debug("DRA driver %s: ResourceSlice %s %s by someone else", self.driver, name, kind)
            self.on_change(f"ResourceSlice {name} {kind.lower()}")
        return rv
