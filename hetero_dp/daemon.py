"""Wires backends, resources, servers and watchers together on one event loop.

Per backend it keeps the discovered (physical) records and two health overlays
(events pushed by the backend's ``watch`` hook, results of ``check_health``
polls); a device is healthy only when its record, both overlays and its
physical parent agree. Every change is published to the affected resources,
which wake their ListAndWatch streams only on a real change.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import observe
from .cdi import CDIWriter
from .config import Config
from .delivery import CDIPublisher, parse_delivery
from .device import Device
from .errors import BackendError, ConfigError
from .events import EventSink
from .inotify import DirectoryWatcher
from .kubelet.endpoint import PluginEndpoint
from .names import KUBELET_SOCKET, resource_name_problem
from .ops import Operations
from .plugins import Backend
from .preferred import link_scores
from .resource import Resource
from .sharing import advertise

log = logging.getLogger(__name__)

WATCH_RESTART_BACKOFF = (1.0, 60.0)

Publisher = Callable[["BackendRuntime"], Any]
# physical resource -> (its devices by ID, advertised name -> the devices it advertises)
Plan = dict[str, tuple[dict[str, Device], dict[str, list[Device]]]]


class BackendRuntime:
    """What the daemon knows about one backend's devices."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.discovered: dict[str, Device] = {}
        self.event_health: dict[str, tuple[bool, str]] = {}
        self.poll_health: dict[str, tuple[bool, str]] = {}
        self.faults: dict[str, str] = {}  # "discover" / "watch" -> reason
        self.published: dict[str, Device] = {}
        self.resources: dict[str, set[str]] = {}  # physical resource -> advertised names
        self.rediscover_wanted = asyncio.Event()
        self.sink: EventSink | None = None
        self.watch_thread: threading.Thread | None = None
        self.watch_task: asyncio.Task[None] | None = None
        self.poll_busy = False
        # Events are numbered; a discovery remembers the number current when it
        # started, so a "healthy" event that arrives while a slow discovery still
        # reads the old, unhealthy state wins over that stale verdict.
        self.event_seq = 0
        self.event_stamp: dict[str, int] = {}
        self.discovered_at = 0
        # Discoveries may overlap (the rediscovery loop, a reload): each is numbered,
        # and one that ends after a newer one has been applied is stale and dropped.
        self.discoveries = 0
        self.discovery_applied = 0

    def _newer_recovery(self, d: Device) -> str | None:
        for key in (d.parent, d.id):
            if key is None or key not in self.event_health:
                continue
            ok, why = self.event_health[key]
            if ok and self.event_stamp.get(key, 0) > self.discovered_at:
                return why
        return None

    def effective(self) -> list[Device]:
        fault = "; ".join(self.faults.values())
        overlays = (self.event_health, self.poll_health)
        out = []
        for d in self.discovered.values():
            healthy, reason = d.healthy, d.reason
            if not healthy and (recovered := self._newer_recovery(d)) is not None:
                healthy, reason = True, recovered
            # verdicts on the device and on its physical parent, events before polls
            verdicts = [
                o[k] for o in overlays for k in (d.parent, d.id) if k is not None and k in o
            ]
            if healthy:
                why = next((why for ok, why in verdicts if not ok), None)
                if why is not None:
                    healthy, reason = False, why
            if fault and healthy:
                healthy, reason = False, fault
            if healthy and not reason:
                # a recovery reason stays visible until the next change
                for ok, why in verdicts:
                    if ok:
                        reason = why or reason
            out.append(
                d if (healthy, reason) == (d.healthy, d.reason) else d.with_health(healthy, reason)
            )
        return out


class Daemon:
    # False: discover, watch health and publish, but serve no device-plugin
    # endpoints (DRA mode serves the devices through its own drivers).
    serve_device_plugins = True

    def __init__(self, config: Config, backends: list[Backend]) -> None:
        self.config = config
        self.backends = backends
        self.runtimes = {b.name: BackendRuntime(b) for b in backends}
        self.resources: dict[str, Resource] = {}
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.resource_defaults: dict[str, dict[str, Any]] = {}  # from backends' hook
        self.publishers: list[Publisher] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._watchers: list[DirectoryWatcher] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._started = False
        self._stop_event = asyncio.Event()
        self.ready = asyncio.Event()
        # --- operations: metrics, probes, labels, reload (hetero_dp/ops.py) ---
        self.config_path: Path | None = None  # set with config_loader to enable reload
        self.config_loader: Callable[[], Config] | None = None
        self.ops = Operations(self)

    # --- start-up --------------------------------------------------------

    async def start(self) -> None:
        """Configure, discover, validate, then serve and register. ConfigError = bad setup."""
        self._stop_event.clear()  # a daemon stopped before may be started again
        await self.ops.start()  # probes first: /readyz says "starting" meanwhile
        for b in self.backends:
            b.timeout = self.config.hook_timeout
            b.options = self.config.backend_options(b.name)
            await b.configure(b.options)
        if self.config.cdi.get("enabled"):
            writer = CDIWriter(self.config.cdi["dir"])
            try:
                writer.check(field="cdi.dir")
            except ConfigError as e:
                raise ConfigError(e.reason, field=e.field, source=self.config.source) from None
            self.publishers.append(CDIPublisher(writer, self.settings_for))
        for rt in self.runtimes.values():
            await self._discover(rt)
        self._check_startup_names()
        for rt in self.runtimes.values():
            await self._publish(rt)
        if self.serve_device_plugins:
            self._watch_kubelet_dir()
        self._started = True
        await asyncio.gather(*(ep.start() for ep in self.endpoints.values()))
        loop = asyncio.get_running_loop()
        for rt in self.runtimes.values():
            self._start_watch(rt)
            self._tasks.append(
                loop.create_task(self._rediscover_loop(rt), name=f"rediscover {rt.backend.name}")
            )
        if self.config.health_interval > 0:
            self._tasks.append(loop.create_task(self._health_loop(), name="health poll"))
        self.ready.set()

    def _check_startup_names(self) -> None:
        for rt in self.runtimes.values():
            for d in rt.discovered.values():
                problem = resource_name_problem(d.resource)
                if problem:
                    raise ConfigError(
                        f"device {d.id!r}: {problem}",
                        field="resource",
                        source=f"backend {rt.backend.name}",
                    )
        check = getattr(self.config.sharing, "validate_devices", None)
        if check is not None:
            physical = [d for rt in self.runtimes.values() for d in rt.discovered.values()]
            check(physical)

    def _watch_kubelet_dir(self) -> None:
        plugin_dir = self.config.kubelet_dir
        plugin_dir.mkdir(parents=True, exist_ok=True)
        w = DirectoryWatcher(plugin_dir, self._on_plugin_dir_event)
        w.start()
        self._watchers.append(w)
        if self.config.registration == "watcher":
            reg = self.config.plugins_registry_dir
            reg.mkdir(parents=True, exist_ok=True)
            w2 = DirectoryWatcher(reg, self._on_registry_dir_event)
            w2.start()
            self._watchers.append(w2)

    def _on_plugin_dir_event(self, name: str, kind: str) -> None:
        if kind == "created" and name == KUBELET_SOCKET:
            log.info("kubelet.sock created: the kubelet restarted; re-registering")
            observe.emit("kubelet_restart", reason="kubelet.sock created")
            for ep in self.endpoints.values():
                if ep.mode == "watcher":
                    # the kubelet's plugin watcher walks plugins_registry on start and
                    # registers us itself; a restart here would only register twice
                    continue
                ep.notify_kubelet_appeared()
                # Still registering (first start, or the kubelet came late) with our
                # socket in place: waking the pending Register is enough. A restart
                # would send a second, overlapping Register that the kubelet may
                # finish in either order.
                if ep.resource.registered or not ep.socket_path.exists():
                    ep.request_restart("kubelet.sock created")
            return
        if kind == "deleted":
            for ep in self.endpoints.values():
                if name == ep.socket_name and not ep.changing and not ep.socket_path.exists():
                    log.info(
                        "own socket %s deleted; restarting",
                        name,
                        extra={"resource": ep.resource.name},
                    )
                    observe.emit("kubelet_restart", reason=f"{name} deleted")
                    ep.request_restart(f"socket {name} deleted")

    def _on_registry_dir_event(self, name: str, kind: str) -> None:
        if kind != "deleted":
            return
        for ep in self.endpoints.values():
            sock = ep.registry_socket
            if sock is not None and name == sock.name and not ep.changing and not sock.exists():
                ep.request_restart(f"registration socket {name} deleted")

    # --- resources -------------------------------------------------------

    @property
    def owner(self) -> dict[str, str]:
        """Advertised resource -> the name of the backend serving it."""
        return {name: res.backend.name for name, res in self.resources.items()}

    def settings_for(self, name: str) -> dict[str, Any]:
        """A resource's settings: the backend's defaults under the config file's section."""
        return {**self.resource_defaults.get(name, {}), **self.config.resource_settings(name)}

    def _wants_defaults(self, name: str, rt: BackendRuntime) -> bool:
        return name not in self.resource_defaults and rt.backend.implements("resource_defaults")

    async def _load_defaults(self, name: str, rt: BackendRuntime) -> None:
        if not self._wants_defaults(name, rt):  # loaded already (by a concurrent publish too)
            return
        try:
            defaults = await rt.backend.resource_defaults(name)
            parse_delivery(
                {**defaults, **self.config.resource_settings(name)},
                f"resource_defaults({name})",
                resource=name,
            )
        except (BackendError, ConfigError) as e:
            self._hook_error(rt, "resource_defaults", e)
            defaults = {}
        self.resource_defaults[name] = dict(defaults)

    def _ensure_resource(self, name: str, rt: BackendRuntime) -> Resource | None:
        res = self.resources.get(name)
        if res is not None:
            if res.backend.name == rt.backend.name:
                return res
            self._refuse_resource(
                rt,
                f"resource {name} is served by backend {res.backend.name!r} already; "
                f"ignoring {rt.backend.name!r}",
            )
            return None
        res = Resource(
            name, rt.backend, settings=self.settings_for(name), sharing=self.config.sharing
        )
        if self.serve_device_plugins:
            try:
                ep = PluginEndpoint(
                    res,
                    plugin_dir=self.config.kubelet_dir,
                    registry_dir=self.config.plugins_registry_dir,
                    mode=self.config.registration,
                    socket_prefix=self.config.socket_prefix,
                    stream_timeout=self.config.stream_timeout,
                )
            except ValueError as e:  # its socket path does not fit
                self._refuse_resource(rt, f"resource {name}: {e}")
                return None
            self.endpoints[name] = ep
            if self._started:
                self._tasks.append(asyncio.get_running_loop().create_task(ep.start()))
        self.resources[name] = res
        return res

    def _refuse_resource(self, rt: BackendRuntime, msg: str) -> None:
        """A resource that cannot be served: a ConfigError at start-up, later an error logged."""
        if not self._started:
            raise ConfigError(msg, field="resource", source=f"backend {rt.backend.name}")
        log.error(msg)

    async def _publish(self, rt: BackendRuntime) -> None:
        """Push the backend's effective devices to its resources."""
        # Load new resources' defaults first, then read the devices and update every
        # resource without awaiting: a publish that read them before an await could
        # finish after a newer one and put its stale view back.
        while True:
            effective = rt.effective()
            plan, invalid = self._plan(rt, effective)
            missing = {
                name
                for phys, (_, grouped) in plan.items()
                for name in set(grouped) | rt.resources.get(phys, set())
                if self._wants_defaults(name, rt)
            }
            if not missing:
                break
            for name in sorted(missing):
                await self._load_defaults(name, rt)
        self._log_transitions(rt, effective)
        ids_changed = set(rt.published) != {d.id for d in effective}
        rt.published = {d.id: d for d in effective}
        for d in invalid:
            log.error(
                "backend %r: device %r has an invalid resource name %r; ignored",
                rt.backend.name,
                d.id,
                d.resource,
            )
        for phys, (physical_map, grouped) in plan.items():
            for name in set(grouped) | rt.resources.get(phys, set()):
                res = self._ensure_resource(name, rt)
                if res is None:
                    continue
                if res.state.update(grouped.get(name, []), physical_map):
                    observe.emit(
                        "devices_changed",
                        resource=name,
                        total=len(res.state.devices),
                        healthy=res.state.healthy_count,
                    )
            rt.resources[phys] = set(grouped) or rt.resources.get(phys, set())
        if ids_changed and rt.backend.implements("links"):
            await self._refresh_links(rt)
        for publish in self.publishers:
            try:
                result = publish(rt)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("publisher %r failed", publish)

    def _plan(self, rt: BackendRuntime, effective: list[Device]) -> tuple[Plan, list[Device]]:
        """Per physical resource: its devices by ID and what each advertised name gets;
        and the devices left out for an invalid resource name."""
        by_resource: dict[str, list[Device]] = {}
        invalid = []
        for d in effective:
            if resource_name_problem(d.resource):
                invalid.append(d)
            else:
                by_resource.setdefault(d.resource, []).append(d)
        for phys in set(rt.resources) - set(by_resource):
            by_resource[phys] = []
        plan = {}
        for phys, devices in by_resource.items():
            grouped: dict[str, list[Device]] = {}
            for d in advertise(devices, self.config.sharing):
                grouped.setdefault(d.resource, []).append(d)
            plan[phys] = ({d.id: d for d in devices}, grouped)
        return plan, invalid

    def _log_transitions(self, rt: BackendRuntime, effective: Iterable[Device]) -> None:
        for d in effective:
            old = rt.published.get(d.id)
            if old is not None and old.healthy != d.healthy:
                level = logging.INFO if d.healthy else logging.WARNING
                log.log(
                    level,
                    "device %s is now %s%s",
                    d.id,
                    d.health,
                    f": {d.reason}" if d.reason else "",
                    extra={"resource": d.resource, "device": d.id, "reason": d.reason},
                )
                observe.emit(
                    "health_transition",
                    resource=d.resource,
                    device=d.id,
                    healthy=d.healthy,
                    reason=d.reason,
                )

    async def _refresh_links(self, rt: BackendRuntime) -> None:
        try:
            links = await rt.backend.links(list(rt.discovered.values()))
        except BackendError as e:
            self._hook_error(rt, "links", e)
            return
        table = link_scores(links)
        for names in rt.resources.values():
            for name in names:
                if name in self.resources:
                    self.resources[name].links = table

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _hook_error(self, rt: BackendRuntime, hook: str, e: Exception) -> None:
        log.error("%s", e, extra={"backend": rt.backend.name, "hook": hook})
        observe.emit("hook_error", backend=rt.backend.name, hook=hook, error=str(e))

    # --- discovery and health -------------------------------------------

    async def _discover(self, rt: BackendRuntime) -> None:
        rt.discoveries += 1
        number, started_at = rt.discoveries, rt.event_seq
        try:
            devices = await rt.backend.discover()
        except BackendError as e:
            self._hook_error(rt, "discover", e)
            if number > rt.discovery_applied:
                rt.discovery_applied = number
                rt.faults["discover"] = f"discovery failed: {str(e.__cause__ or '') or e}"
            return
        if number < rt.discovery_applied:
            return
        rt.discovery_applied = number
        rt.faults.pop("discover", None)
        rt.discovered = {d.id: d for d in devices}
        rt.discovered_at = started_at
        known = set(rt.discovered) | {d.parent for d in devices if d.parent}
        for overlay in (rt.event_health, rt.poll_health):
            for key in [k for k in overlay if k not in known]:
                del overlay[key]

    async def rediscover(self, backend_name: str | None = None) -> None:
        """Discover again now (all backends, or one) and publish the result."""
        for rt in self.runtimes.values():
            if backend_name is None or rt.backend.name == backend_name:
                await self._discover(rt)
                await self._publish(rt)

    async def _rediscover_loop(self, rt: BackendRuntime) -> None:
        interval = self.config.rediscover_interval or None
        # On 3.10/3.11 a wait_for here or in a hook call can swallow the cancel that
        # arrives in the same loop turn (REFERENCE.md section 7); stop() would then
        # await this task forever, so the stop event is checked after every wait.
        while not self._stop_event.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(rt.rediscover_wanted.wait(), interval)
            if self._stop_event.is_set():
                return
            rt.rediscover_wanted.clear()
            await self._discover(rt)
            await self._publish(rt)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval)  # the poll period, not a sync
            await self.poll_health()

    async def poll_health(self) -> None:
        """Run every backend's check_health over its devices once, concurrently."""
        await asyncio.gather(
            *(
                self._poll_backend(rt)
                for rt in self.runtimes.values()
                if rt.backend.implements("check_health")
            )
        )

    async def _poll_backend(self, rt: BackendRuntime) -> None:
        if rt.poll_busy:  # a previous poll still hangs in the backend: do not pile up
            return
        rt.poll_busy = True
        try:
            devices = list(rt.discovered.values())

            async def one(d: Device) -> tuple[str, tuple[bool, str]]:
                try:
                    return d.id, await rt.backend.check_health(d)
                except BackendError as e:
                    self._hook_error(rt, "check_health", e)
                    return d.id, (False, str(e))

            results = await asyncio.gather(*(one(d) for d in devices))
            for device_id, verdict in results:
                if device_id not in rt.discovered:  # gone while polled: would outlive it
                    continue
                if verdict[0] and device_id not in rt.poll_health:
                    continue
                rt.poll_health[device_id] = verdict
        finally:
            rt.poll_busy = False
        await self._publish(rt)

    def set_health(
        self, backend_name: str, device_id: str, healthy: bool, reason: str = ""
    ) -> None:
        """Record a pushed health event (fans out to slices and replicas) and publish."""
        rt = self.runtimes[backend_name]
        rt.event_seq += 1
        rt.event_health[device_id] = (healthy, reason)
        rt.event_stamp[device_id] = rt.event_seq
        self._spawn(self._publish(rt))

    # --- watch hooks -----------------------------------------------------

    def _start_watch(self, rt: BackendRuntime) -> None:
        b = rt.backend
        if not b.implements("watch"):
            return
        loop = asyncio.get_running_loop()
        sink = EventSink(
            loop,
            lambda i, ok, why: self.set_health(b.name, i, ok, why),
            rt.rediscover_wanted.set,
        )
        rt.sink = sink
        impl = b._impls["watch"]
        if inspect.iscoroutinefunction(impl.function):
            rt.watch_task = loop.create_task(
                self._run_async_watch(rt, sink), name=f"watch {b.name}"
            )
        else:
            t = threading.Thread(
                target=self._run_thread_watch,
                args=(rt, sink, loop),
                name=f"hdp-watch-{b.name}",
                daemon=True,
            )
            rt.watch_thread = t
            t.start()

    async def _run_async_watch(self, rt: BackendRuntime, sink: EventSink) -> None:
        delay = WATCH_RESTART_BACKOFF[0]
        while not sink.stopping.is_set():
            try:
                watch: Any = rt.backend._impls["watch"].function
                await watch(events=sink)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._watch_failed(rt, e)
            await asyncio.sleep(delay)  # backoff before restarting a crashed watcher
            delay = min(delay * 2, WATCH_RESTART_BACKOFF[1])
            self._watch_restarted(rt)

    def _run_thread_watch(
        self, rt: BackendRuntime, sink: EventSink, loop: asyncio.AbstractEventLoop
    ) -> None:
        delay = WATCH_RESTART_BACKOFF[0]
        while not sink.stopping.is_set():
            try:
                rt.backend._impls["watch"].function(events=sink)
                return
            except Exception as e:
                if loop.is_closed():
                    return
                loop.call_soon_threadsafe(self._watch_failed, rt, e)
            if sink.stopping.wait(delay):
                return
            delay = min(delay * 2, WATCH_RESTART_BACKOFF[1])
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._watch_restarted, rt)

    def _watch_failed(self, rt: BackendRuntime, e: BaseException) -> None:
        err = BackendError(f"backend {rt.backend.name!r} hook watch raised {e!r}")
        self._hook_error(rt, "watch", err)
        rt.faults["watch"] = f"health watcher failed: {e!r}"
        self._spawn(self._publish(rt))

    def _watch_restarted(self, rt: BackendRuntime) -> None:
        if rt.faults.pop("watch", None):
            log.info("restarted the health watcher of backend %r", rt.backend.name)
            self._spawn(self._publish(rt))

    # --- reload (hetero_dp/reload.py) ------------------------------------

    async def apply_config(self, new: Config) -> dict[str, list[str]]:
        """Apply a new config while running; ConfigError (and the old one kept) if it cannot."""
        from .reload import apply_config

        return await apply_config(self, new)

    # --- shutdown --------------------------------------------------------

    def request_stop(self) -> None:
        self._stop_event.set()

    async def wait_stopped(self) -> None:
        await self._stop_event.wait()

    async def stop(self) -> None:
        """End streams, stop servers, remove own sockets, shut backends down."""
        self._stop_event.set()  # loops that may have swallowed their cancel check it
        await self.ops.stop()
        for rt in self.runtimes.values():
            if rt.sink is not None:
                rt.sink.stopping.set()
            if rt.watch_task is not None:
                rt.watch_task.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for w in self._watchers:
            w.close()
        self._watchers.clear()
        await asyncio.gather(*(ep.stop() for ep in self.endpoints.values()))
        for rt in self.runtimes.values():
            if rt.watch_task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await rt.watch_task
            if rt.watch_thread is not None:  # it may still be inside a vendor call
                await asyncio.get_running_loop().run_in_executor(None, rt.watch_thread.join, 5)
            try:
                await rt.backend.call("shutdown", timeout=5)
            except BackendError as e:
                self._hook_error(rt, "shutdown", e)
            rt.backend.close()
        self.ready.clear()

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT, then stop cleanly."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        try:
            await self.start()
            log.info("serving %s", ", ".join(sorted(self.resources)) or "no resources yet")
            await self.wait_stopped()
            log.info("stopping")
        finally:
            await self.stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
