"""A tiny in-process event bus: the core says what happened, observers (metrics,
logs, benchmarks) listen. Observers run synchronously on the loop and must be quick;
one that raises is logged and skipped.

Events and their fields:
- ``registered``: resource, mode ("classic", "watcher", or "dra" with driver)
- ``registration_failed``: resource, reason
- ``kubelet_restart``: reason ("kubelet.sock created" / "socket deleted")
- ``stream_opened`` / ``stream_closed``: resource, open (count after the change)
- ``devices_changed``: resource, total, healthy
- ``health_transition``: resource, device, healthy, reason
- ``allocate``: resource, seconds, code ("OK" or the gRPC status name), devices
- ``preferred_allocation``: resource, seconds, code
- ``hook_error``: backend, hook, error
- ``dra_prepare`` / ``dra_unprepare``: driver, seconds, claims, errors
- ``dra_slice_refused``: driver, slice, reason
- ``probe_server``: address, port (the probe server listens, ops/probes.py)
- ``ready_file``: path, ready (the readiness file written or removed, ops/readyfile.py)
- ``config_reload``: result ("applied", "unchanged", "rejected", "failed"), reason
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Observer = Callable[[str, dict[str, Any]], None]
_observers: list[Observer] = []


def subscribe(observer: Observer) -> Callable[[], None]:
    """Add an observer; returns a function that removes it."""
    _observers.append(observer)

    def unsubscribe() -> None:
        if observer in _observers:
            _observers.remove(observer)

    return unsubscribe


def emit(event: str, **fields: Any) -> None:
    for observer in list(_observers):
        try:
            observer(event, fields)
        except Exception:
            log.exception("observer %r failed on %s", observer, event)
