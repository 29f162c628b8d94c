"""The channel through which a backend's ``watch`` hook reports events.

Thread-safe: a blocking watcher (an NVML event wait) calls these methods from
its own thread; they post to the event loop and return at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class EventSink:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_health: Callable[[str, bool, str], None],
        on_rediscover: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._on_health = on_health
        self._on_rediscover = on_rediscover
        self.stopping = threading.Event()

    def _post(self, fn: Callable[..., None], *args: object) -> None:
        if self.stopping.is_set() or self._loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def set_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        """Report a device's (or a physical parent's) health; it fans out to
        every device derived from it (slices, replicas)."""
        self._post(self._on_health, device_id, bool(healthy), reason)

    def rediscover(self) -> None:
        """Ask the framework to call ``discover`` again soon."""
        self._post(self._on_rediscover)

    def wait(self, timeout: float | None = None) -> bool:
        """Block (in a thread) until stopping or the timeout; True when stopping."""
        return self.stopping.wait(timeout)
