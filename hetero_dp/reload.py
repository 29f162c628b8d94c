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
import dataclasses
import logging
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import observe
from .cdi import CDIWriter
from .config import Config
from .delivery import CDIPublisher
from .errors import ConfigError
from .inotify import DirectoryWatcher
from .probes import parse_address
from .sharing import SharingConfig

if TYPE_CHECKING:
    from .daemon import Daemon
    from .plugins import Backend

log = logging.getLogger(__name__)

# Settings that decide where sockets live: changing them needs a restart of the daemon.
FIXED = {
    "kubelet_dir": "kubeletDir",
    "plugins_registry_dir": "pluginsRegistryDir",
    "registration": "registration",
    "socket_prefix": "socketPrefix",
}
DEBOUNCE = 0.2  # editors write in several steps; read the file once they are done
MAX_RESULTS = 100
CONFIGMAP_DATA = "..data"  # a mounted ConfigMap changes by swapping this symlink


async def configure_backend(b: Backend, options: Mapping[str, Any]) -> None:
    """Call the backend's ``configure`` hook; ConfigError naming the backend on refusal."""
    await b.configure(options)
    b.options = options


def _sharing_view(sharing: SharingConfig, physical: str) -> tuple[Any, ...]:
    """What sharing does to one physical resource: its entry, its shared name, its rules."""
    entry = sharing.entry_for(physical)
    if entry is None:
        return (None,)
    entry = dataclasses.replace(entry, field="")  # where it sits in the file does not matter
    return (entry, sharing.shared_name(physical), sharing.fail_requests_greater_than_one)


def _sharing_affected(daemon: Daemon, old: Config, new: Config) -> set[str]:
    """Advertised resources (old and new names) whose sharing changed."""
    if old.sharing == new.sharing:
        return set()
    names: set[str] = set()
    for rt in daemon.runtimes.values():
        for physical, advertised in rt.resources.items():
            if _sharing_view(old.sharing, physical) != _sharing_view(new.sharing, physical):
                names |= {physical, *advertised, new.sharing.shared_name(physical)}
    return names


def _restart_loop_tasks(daemon: Daemon, old: Config, new: Config) -> None:
    loop = asyncio.get_running_loop()
    tasks = daemon._tasks
    if old.health_interval != new.health_interval:
        for t in [t for t in tasks if t.get_name() == "health poll"]:
            t.cancel()
            tasks.remove(t)
        if new.health_interval > 0:
            tasks.append(loop.create_task(daemon._health_loop(), name="health poll"))
    if old.rediscover_interval != new.rediscover_interval:
        for rt in daemon.runtimes.values():
            name = f"rediscover {rt.backend.name}"
            for t in [t for t in tasks if t.get_name() == name]:
                t.cancel()
                tasks.remove(t)
            # The old loop may be cancelled inside a rediscover it had taken the request
            # for (a watch hook's "the device set changed"): the new loop does it again.
            rt.rediscover_wanted.set()
            tasks.append(loop.create_task(daemon._rediscover_loop(rt), name=name))


async def _configure_changed(daemon: Daemon, old: Config, new: Config) -> list[Backend]:
    """Re-configure the backends whose options changed; all or none (rolled back)."""
    changed = [
        b for b in daemon.backends if old.backend_options(b.name) != new.backend_options(b.name)
    ]
    done: list[Backend] = []
    for b in changed:
        try:
            await configure_backend(b, new.backend_options(b.name))
        except ConfigError:
            for ok in done:
                try:
                    await configure_backend(ok, old.backend_options(ok.name))
                except ConfigError as e:
                    log.error("restoring the old options of backend %r failed: %s", ok.name, e)
            raise
        done.append(b)
    return changed


def _check_cdi(old: Config, new: Config) -> CDIWriter | None:
    """A writer for the new ``cdi`` section, checked before anything changes
    (``enabled`` unset: checked when the first spec is needed)."""
    if old.cdi == new.cdi or new.cdi.get("enabled") is False:
        return None
    if new.cdi.get("enabled") is None:
        return CDIWriter(new.cdi["dir"])
    writer = CDIWriter(new.cdi["dir"])
    try:
        writer.check(field="cdi.dir")
    except ConfigError as e:
        raise ConfigError(e.reason, field=e.field, source=new.source) from None
    return writer


def _swap_cdi_publisher(daemon: Daemon, writer: CDIWriter | None) -> None:
    for old in [p for p in daemon.publishers if isinstance(p, CDIPublisher)]:
        daemon.publishers.remove(old)
        for kind in list(old._devices):  # specs nobody keeps up to date any more
            with contextlib.suppress(OSError):
                old.writer.remove(kind)
    if writer is not None:
        lazy = daemon.config.cdi.get("enabled") is None
        daemon.publishers.append(CDIPublisher(writer, daemon.settings_for, check_first=lazy))


async def apply_config(daemon: Daemon, new: Config) -> dict[str, list[str]]:
    """Apply ``new`` to a running daemon; ConfigError (old config kept) if it cannot be.

    Returns what was done: ``{"restarted": [resources], "reconfigured": [backends]}``.
    """
    old = daemon.config
    for attr, key in FIXED.items():
        if getattr(old, attr) != getattr(new, attr):
            raise ConfigError(
                f"cannot change while running (was {getattr(old, attr)}, now "
                f"{getattr(new, attr)}); restart the daemon to apply it",
                field=key,
                source=new.source,
            )
    if new.metrics.get("address"):
        try:
            parse_address(str(new.metrics["address"]))
        except ConfigError as e:
            raise ConfigError(e.reason, field=e.field, source=new.source) from None

    if new.sharing != old.sharing:  # the new sharing must fit the devices there are
        physical = [d for rt in daemon.runtimes.values() for d in rt.discovered.values()]
        try:
            new.sharing.validate_devices(physical)
        except ConfigError as e:
            raise ConfigError(e.reason, field=e.field, source=new.source) from None
    before = {name: daemon.settings_for(name) for name in daemon.resources}
    await daemon.ops.prepare(old, new)  # binds a new probe address, or refuses
    try:
        cdi_writer = _check_cdi(old, new)
        changed = await _configure_changed(daemon, old, new)  # last: it rolls back itself
    except ConfigError:
        await daemon.ops.discard()
        raise

    # From here on nothing refuses.
    daemon.config = new
    for b in daemon.backends:
        b.timeout = new.hook_timeout
    for ep in daemon.endpoints.values():
        ep.stream_timeout = new.stream_timeout
    _restart_loop_tasks(daemon, old, new)
    if (old.log_level, old.log_format) != (new.log_level, new.log_format):
        from .logs import setup_logging

        setup_logging(new.log_level, new.log_format)

    # a re-configured backend may give other defaults (NVIDIA: deviceListStrategy -> deliver)
    for b in changed:
        rt = daemon.runtimes[b.name]
        for name in [n for n, owner in daemon.owner.items() if owner == b.name]:
            daemon.resource_defaults.pop(name, None)
            await daemon._load_defaults(name, rt)
    restart = {name for name in daemon.resources if daemon.settings_for(name) != before[name]}
    affected = _sharing_affected(daemon, old, new)
    for res in daemon.resources.values():
        res.sharing = new.sharing
        res.settings = daemon.settings_for(res.name)  # backend defaults under the new section
    restart |= affected & set(daemon.resources)
    if old.cdi != new.cdi:
        _swap_cdi_publisher(daemon, cdi_writer)

    for b in changed:
        await daemon.rediscover(b.name)
    # publish again: CDI specs and labels follow new settings; streams wake only on change
    for rt in daemon.runtimes.values():
        if rt.backend not in changed:
            await daemon._publish(rt)
    for name in sorted(restart):
        if name in daemon.endpoints:
            daemon.endpoints[name].request_restart("its configuration changed")
    await daemon.ops.apply(old, new)
    summary = {"restarted": sorted(restart), "reconfigured": [b.name for b in changed]}
    log.info(
        "applied the new config from %s: restarted %s; re-configured %s",
        new.source,
        ", ".join(summary["restarted"]) or "no resources",
        ", ".join(summary["reconfigured"]) or "no backends",
    )
    return summary


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
        try:
            return self.path.read_bytes()
        except OSError:
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
            while self._wanted.is_set():  # quiet period: coalesce a burst of writes
                self._wanted.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wanted.wait(), DEBOUNCE)
            forced, self._forced = self._forced, False
            await self.reload(force=forced)

    async def reload(self, *, force: bool = False) -> str:
        """Load and apply the config now: ``applied``, ``unchanged``, ``rejected`` or ``failed``."""
        data = self._read()
        if data is not None and data == self._last and not force:
            return await self._record("unchanged", "")
        try:
            new = self.loader()
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

        await asyncio.wait_for(waiter(), timeout)
        return self.results
