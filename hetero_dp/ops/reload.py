"""Hot reload: SIGHUP or a change of the config file applies the new config.

An invalid new config (bad YAML, a bad field, a backend refusing its options)
is rejected with the reason and the old one stays in force. A valid one is
applied with the least disturbance: only resources whose settings changed
restart (stop, serve, re-register); backends whose options changed are
re-configured and rediscover; every other ListAndWatch stream stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hetero_dp.engine.config import Config
from hetero_dp.engine.configfile import MAX_CONFIG_BYTES
from hetero_dp.kits import observe
from hetero_dp.kits.aiotools import wait_event, with_timeout
from hetero_dp.kits.foreign import ForeignFileError, read_foreign
from hetero_dp.kits.inotify import DirectoryWatcher
from hetero_dp.model.errors import ConfigError

if TYPE_CHECKING:
    from hetero_dp.engine.daemon import Daemon

log = logging.getLogger(__name__)

DEBOUNCE = 0.2  # editors write in several steps; read the file once they are done
# A burst of changes is applied at most this long after its first event, even while
# events keep coming (a storm must not hold the last change back for ever).
MAX_DELAY = 2.0
# A file that changed while it was read is read again, this many times at most.
READ_TRIES = 5
MAX_RESULTS = 100
CONFIGMAP_DATA = "..data"  # a mounted ConfigMap changes by swapping this symlink


class ConfigReloader:
    """Re-reads the config on SIGHUP and when its file changes; applies or rejects it."""

    def __init__(
        self,
        daemon: Daemon,
        path: str | Path,
        loader: Callable[[], Config],
        *,
        handle_sighup: bool = True,
    ) -> None:
        self.daemon = daemon
        self.path = Path(path)
        self.loader = loader
        self.handle_sighup = handle_sighup
        self.results: list[str] = []  # the last reloads: "applied: ...", "rejected: why" ...
        self.finished = 0  # reloads done since start
        self._wanted = asyncio.Event()
        self._forced = False
        self._last = self._read()
        self._watcher: DirectoryWatcher | None = None
        self._task: asyncio.Task[None] | None = None
        self._sighup = False
        self._done = asyncio.Condition()

    def _read(self) -> bytes | None:
        # on the loop: a FIFO put in the file's place must not block it (kits/foreign.py)
        try:
            return read_foreign(self.path, max_bytes=MAX_CONFIG_BYTES, follow=True)
        except ForeignFileError:
            return None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.handle_sighup and threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(signal.SIGHUP, self.request, True)
            self._sighup = True
        self._watcher = DirectoryWatcher(self.path.parent, self._on_event, modified=True)
        self._watcher.start()
        self._task = loop.create_task(self._run(), name="config reload")

    async def stop(self) -> None:
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def request(self, force: bool = False) -> None:
        """Ask for a reload (``force``: even if the file's bytes did not change)."""
        self._forced = self._forced or force
        self._wanted.set()

    def _on_event(self, name: str, kind: str) -> None:
        if kind in ("created", "modified") and name in (self.path.name, CONFIGMAP_DATA):
            self.request()

    async def _run(self) -> None:
        while True:
            await self._wanted.wait()
            await self.daemon.ready.wait()  # a reload during start-up waits for it
            # Quiet period: coalesce a burst of writes, applying the latest file at most
            # DEBOUNCE after the last event and at most MAX_DELAY after the first.
            deadline = asyncio.get_running_loop().time() + MAX_DELAY
            while self._wanted.is_set():
                self._wanted.clear()
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                await wait_event(self._wanted, min(DEBOUNCE, left))
            forced, self._forced = self._forced, False
            await self.reload(force=forced)

    async def reload(self, *, force: bool = False) -> str:
        """Load and apply the config now: ``applied``, ``unchanged``, ``rejected`` or ``failed``."""
        data = self._read()
        if data is not None and data == self._last and not force:
            return await self._record("unchanged", "")
        try:
            # reading and checking a file (YAML, sizes) is done off the loop: the
            # streams and RPCs of every resource go on meanwhile. A file that changed
            # while the loader read it (a writer mid-way) is read again.
            for _ in range(READ_TRIES):
                new = await asyncio.to_thread(self.loader)
                after = self._read()
                if after == data:
                    break
                data = after
            else:
                raise ConfigError(
                    f"the file kept changing while it was read ({READ_TRIES} reads); "
                    "the next change is applied",
                    source=str(self.path),
                )
            summary = await self.daemon.apply_config(new)
        except ConfigError as e:
            log.error("config reload rejected, keeping the old config: %s", e)
            return await self._record("rejected", str(e))
        except Exception as e:  # a bug, not a bad file: say so and keep reloading later
            log.exception("config reload failed")
            return await self._record("failed", repr(e))
        self._last = data
        return await self._record("applied", repr(summary))

    async def _record(self, result: str, detail: str) -> str:
        observe.emit("config_reload", result=result, reason=detail)
        self.results.append(f"{result}: {detail}" if detail else result)
        del self.results[:-MAX_RESULTS]
        self.finished += 1
        async with self._done:
            self._done.notify_all()
        return result

    async def wait_results(self, count: int, timeout: float = 10.0) -> list[str]:
        """Wait until ``count`` reloads have finished (for tests and tools)."""

        async def waiter() -> None:
            async with self._done:
                await self._done.wait_for(lambda: self.finished >= count)

        await with_timeout(waiter(), timeout)
        return self.results
