"""The readiness file (config ``metrics.readyFile``): present exactly while ``/readyz``
would answer 200, holding the same lines.

Why a file: a pod in the host network shares the node's ports, so during a surge
rollout the kubelet's HTTP probe of the new pod reaches whichever instance holds
the metrics port, usually the old one (ready), and the old pod would be stopped
before the new one is registered. An exec probe (``cat FILE``) runs inside the new
pod's own container and reads the new instance's own readiness.

The file follows the daemon: re-judged right after each registration and stream
event (any daemon's: the bus is per process; judging again is cheap) and every
``INTERVAL`` seconds in case a change came without an event; written atomically,
removed when not ready and at stop (first of all: a stopping pod is not ready).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetero_dp.kits import observe
from hetero_dp.kits.atomic import write_atomic

if TYPE_CHECKING:
    from hetero_dp.engine.daemon import Daemon

log = logging.getLogger(__name__)

INTERVAL = 1.0
EVENTS = frozenset(
    {"registered", "registration_failed", "stream_opened", "stream_closed"}
    | {"kubelet_restart", "devices_changed", "dra"}
)


class ReadyFile:
    def __init__(self, daemon: Daemon, path: str | Path) -> None:
        self.daemon = daemon
        self.path = Path(path)
        self._written: str | None = None  # what the file holds, None: absent
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Any = None
        self._wake: asyncio.Event | None = None

    def start(self) -> None:
        self._remove()  # a file left by an earlier run of this container is not ours
        loop = asyncio.get_running_loop()
        wake = self._wake = asyncio.Event()

        def on_event(event: str, fields: dict[str, Any]) -> None:
            if event in EVENTS and not loop.is_closed():  # a loop gone without stop()
                loop.call_soon_threadsafe(wake.set)

        self._unsubscribe = observe.subscribe(on_event)
        self._task = loop.create_task(self._follow())

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._remove()

    def update(self) -> bool:
        """Judge readiness now and make the file say so; returns it."""
        ready, lines = self.daemon.readiness()
        text = "\n".join(lines) + "\n"
        if not ready:
            if self._written is not None:
                self._remove()
                observe.emit("ready_file", path=str(self.path), ready=False)
        elif text != self._written:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(self.path, text)
            except OSError as e:
                log.error("cannot write the readiness file %s: %s", self.path, e.strerror)
            else:
                first, self._written = self._written is None, text
                if first:
                    observe.emit("ready_file", path=str(self.path), ready=True)
        return ready

    async def _follow(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            self.update()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), INTERVAL)

    def _remove(self) -> None:
        self._written = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.error("cannot remove the readiness file %s: %s", self.path, e.strerror)
