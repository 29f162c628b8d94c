"""The daemon: wires backends, resources, servers and watchers together on one
event loop, and owns their lifecycle (start, stop, signals).

The pieces it wires live beside it: each backend's devices and health overlays
(:mod:`.runtime`), its watch hook (:mod:`.watching`), what a publish sends to
which resource (:mod:`.publishing`), a config applied while running
(:mod:`.reconfigure`), and the kubelet dir watch (:mod:`hetero_dp.deviceplugin.dirwatch`).

Public surface for day-two pieces (``hetero_dp.ops``), which the engine never
imports: :attr:`Daemon.resources` and :meth:`Daemon.devices` (what each resource
advertises), :attr:`Daemon.runtimes` (read-only), :meth:`Daemon.readiness`,
:meth:`Daemon.apply_config`, :meth:`Daemon.request_rediscover`,
:meth:`Daemon.add_publisher` / :meth:`Daemon.remove_publisher`, extensions
(:mod:`.extension`), and the events on :mod:`hetero_dp.kits.observe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetero_dp.allocation.cdi import spec_device_problems
from hetero_dp.allocation.delivery import parse_delivery
from hetero_dp.allocation.gate import Refused, gate_device, refusal
from hetero_dp.allocation.preferred import link_scores
from hetero_dp.deviceplugin.dirwatch import KubeletDirWatch
from hetero_dp.deviceplugin.endpoint import PluginEndpoint
from hetero_dp.engine.backend import Backend
from hetero_dp.engine.cdi_publisher import CDIPublisher, make_cdi_publisher
from hetero_dp.engine.config import Config
from hetero_dp.engine.extension import Extension
from hetero_dp.engine.polling import HealthPolls
from hetero_dp.engine.publishing import (
    Plan,
    check_names,
    log_transitions,
    oversized,
    plan,
    too_large,
)
from hetero_dp.engine.resource import Resource
from hetero_dp.engine.runtime import BackendRuntime
from hetero_dp.engine.watching import HookWatch
from hetero_dp.kits import observe
from hetero_dp.kits.aiotools import cancel_and_wait, wait_event
from hetero_dp.kits.logs import Repeats
from hetero_dp.kits.signals import held
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError, ConfigError
from hetero_dp.model.events import EventSink
from hetero_dp.model.names import instance_tag

log = logging.getLogger(__name__)

STOP_TIMEOUT = 3.0  # how long stop() waits for the loops it cancelled

Publisher = Callable[[BackendRuntime], Any]


class Daemon:
    # False: discover, watch health and publish, but serve no device-plugin
    # endpoints (DRA mode serves the devices through its own drivers).
    serve_device_plugins = True

    def __init__(self, config: Config, backends: list[Backend]) -> None:
        self.config = config
        self.backends = backends
        self.runtimes = {b.name: BackendRuntime(b) for b in backends}
        self.cdi_off: str | None = None  # why the runtime cannot consume CDI (cdi.runtimeConfig)
        self.resources: dict[str, Resource] = {}
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.resource_defaults: dict[str, dict[str, Any]] = {}  # from backends' hook
        self.publishers: list[Publisher] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._dir_watch: KubeletDirWatch | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._started = False
        self._held: set[str] = set()  # names whose device set grew past 4 MiB
        self._stop_event = asyncio.Event()
        self.ready = asyncio.Event()
        # names this instance's sockets (after its pod: POD_UID / POD_NAME), so that an
        # old and a new pod of a rolling update never share one
        self.instance = instance_tag(os.environ)
        # day-two pieces (metrics, probes, labels, reload) that plug in from above
        self.extensions: list[Extension] = []
        self._repeats = Repeats()  # how often a failing hook is logged
        self.health = HealthPolls(self.publish, self._hook_error, self._spawn)

    # --- start-up --------------------------------------------------------

    async def start(self) -> None:
        """Configure, discover, validate, then serve and register. ConfigError = bad setup."""
        for rt in self.runtimes.values():
            self.health.wire(rt)
        for b in self.backends:
            b.timeout = self.config.hook_timeout
            await b.configure_from(self.config)
        runtime_config = self.config.cdi.get("runtimeConfig")
        if runtime_config:  # a CDI delivery the runtime would ignore falls back (resource.py)
            from hetero_dp.kits.runtimeconf import runtime_cdi_off

            self.cdi_off = runtime_cdi_off(Path(runtime_config))
        cdi = make_cdi_publisher(self.config.cdi, self.settings_for, self.config.source)
        if cdi is not None:
            self.publishers.append(cdi)
        # The config is checked (backends' options, cdi.dir) before any port is bound;
        # then probes, before discovery: /readyz says "starting" meanwhile.
        for ext in self.extensions:
            await ext.start()
        for rt in self.runtimes.values():
            await self._discover(rt)
        self._check_startup_names()
        for rt in self.runtimes.values():
            await self.publish(rt)
        if cdi is not None and cdi.unusable is not None:  # specs are needed and cannot be
            raise ConfigError(cdi.unusable.reason, field="cdi.dir", source=self.config.source)
        if self.serve_device_plugins:
            self._dir_watch = KubeletDirWatch(
                self.config.kubelet_dir,
                self.config.plugins_registry_dir if self.config.registration == "watcher" else None,
                self.endpoints.values,
            )
            self._dir_watch.start()
        self._started = True
        await asyncio.gather(*(ep.start() for ep in self.endpoints.values()))
        for rt in self.runtimes.values():
            self._start_watch(rt)
        self.restart_loops(None, self.config)
        self.ready.set()

    def restart_loops(self, old: Config | None, new: Config) -> None:
        """(Re)start the health poll and rediscovery loops whose interval changed."""
        loop = asyncio.get_running_loop()
        tasks = self._tasks
        if old is None or old.health_interval != new.health_interval:
            for t in [t for t in tasks if t.get_name() == "health poll"]:
                t.cancel()
                tasks.remove(t)
            if new.health_interval > 0:
                tasks.append(loop.create_task(self._health_loop(), name="health poll"))
        if old is None or old.rediscover_interval != new.rediscover_interval:
            for rt in self.runtimes.values():
                name = f"rediscover {rt.backend.name}"
                for t in [t for t in tasks if t.get_name() == name]:
                    t.cancel()
                    tasks.remove(t)
                if old is not None:
                    # The old loop may be cancelled inside a rediscover it had taken the
                    # request for (a watch hook's "the device set changed"): do it again.
                    rt.rediscover_wanted.set()
                tasks.append(loop.create_task(self._rediscover_loop(rt), name=name))

    # --- the public surface for day-two pieces ------------------------------

    def devices(self, resource: str) -> list[Device]:
        """What ``resource`` advertises now (replicas included), or [] if unknown."""
        res = self.resources.get(resource)
        return list(res.state.devices) if res is not None else []

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, one line per resource) for ``/readyz`` and ``doctor``."""
        if not self.ready.is_set():
            return False, ["daemon: starting"]
        lines = []
        ok = True
        for name, res in sorted(self.resources.items()):
            if res.ready:
                lines.append(f"{name}: ready ({len(res.state.devices)} devices)")
                continue
            ok = False
            why = "no ListAndWatch stream" if res.registered else "not registered with the kubelet"
            lines.append(f"{name}: not ready: {why}")
        if not lines:
            lines.append("no resources: no backend found devices")
        return ok, lines

    def request_rediscover(self, backend_name: str | None = None) -> None:
        """Ask for a rediscovery of one backend (or all) soon; returns at once."""
        for rt in self.runtimes.values():
            if backend_name is None or rt.backend.name == backend_name:
                rt.rediscover_wanted.set()

    def add_publisher(self, publisher: Publisher) -> None:
        """Call ``publisher(runtime)`` after every publish of a backend's devices."""
        self.publishers.append(publisher)

    def remove_publisher(self, publisher: Publisher) -> None:
        if publisher in self.publishers:
            self.publishers.remove(publisher)

    def _check_startup_names(self) -> None:
        """What was discovered, checked as ``list`` and ``topo`` check it
        (:func:`~hetero_dp.engine.publishing.check_names`)."""
        found = {rt.backend.name: rt.discovered.values() for rt in self.runtimes.values()}
        check_names(found, self.config.sharing)

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

    async def load_defaults(self, name: str, rt: BackendRuntime) -> None:
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
            name,
            rt.backend,
            settings=self.settings_for(name),
            sharing=self.config.sharing,
            cdi_off=self.cdi_off,
        )
        if self.serve_device_plugins:
            try:
                ep = PluginEndpoint(
                    res,
                    plugin_dir=self.config.kubelet_dir,
                    registry_dir=self.config.plugins_registry_dir,
                    mode=self.config.registration,
                    socket_prefix=self.config.socket_prefix,
                    instance=self.instance,
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

    async def publish(self, rt: BackendRuntime) -> None:
        """Push the backend's effective devices to its resources."""
        # Load new resources' defaults first, then read the devices and update every
        # resource without awaiting: a publish that read them before an await could
        # finish after a newer one and put its stale view back.
        while True:
            effective = rt.effective()
            planned, invalid = plan(rt, effective, self.config.sharing)
            refused = self._cdi_refusals(planned)
            if refused:  # out of the CDI spec: Unhealthy, so never allocated by CDI name
                effective = [refused.get(d.id, d) for d in effective]
                planned, invalid = plan(rt, effective, self.config.sharing)
            missing = {
                name
                for phys, (_, grouped) in planned.items()
                for name in set(grouped) | rt.resources.get(phys, set())
                if self._wants_defaults(name, rt)
            }
            if not missing:
                break
            for name in sorted(missing):
                await self.load_defaults(name, rt)
        log_transitions(rt, effective)
        ids_changed = set(rt.published) != {d.id for d in effective}
        rt.published = {d.id: d for d in effective}
        for d in invalid:
            log.error(
                "backend %r: device %r has an invalid resource name %r; ignored",
                rt.backend.name,
                d.id,
                d.resource,
            )
        for phys, (physical_map, grouped) in planned.items():
            held = self._hold_oversized(rt, grouped, ids_changed)
            for name in set(grouped) | rt.resources.get(phys, set()):
                res = self._ensure_resource(name, rt)
                if res is None:
                    continue
                advertised = grouped.get(name, [])
                if name in held:  # the devices advertised before that are still there
                    advertised = [d for d in advertised if res.state.get(d.id) is not None]
                if res.state.update(advertised, physical_map):
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

    def _cdi_refusals(self, planned: Plan) -> dict[str, Device]:
        """Devices that cannot be in the CDI spec of a kind their resource delivers by,
        made Unhealthy with the reason (the spec is written for the others)."""
        cdi = next((p for p in self.publishers if isinstance(p, CDIPublisher)), None)
        if cdi is None:
            return {}
        out: dict[str, Device] = {}
        for phys, (physical_map, grouped) in planned.items():
            try:
                kinds = cdi.kinds(phys, set(grouped))
            except ConfigError:
                continue  # the publisher logs it
            for kind in sorted(kinds):
                for d in physical_map.values():
                    if d.id in out or isinstance(d.reason, Refused):
                        continue
                    problems = spec_device_problems(kind, d)
                    if problems:
                        out[d.id] = d.with_health(False, refusal(problems))
        return out

    def _hold_oversized(
        self, rt: BackendRuntime, grouped: dict[str, list[Device]], ids_changed: bool
    ) -> set[str]:
        """Advertised names whose device set would pass the kubelet's 4 MiB limit:
        ConfigError at start-up; afterwards (a rediscovery or a reload that grew the
        set) the names keep the devices advertised before, and the log says why.
        Counted only when the IDs changed or a name is held: a health change keeps
        the size."""
        if not (ids_changed or self._held & grouped.keys()):
            return set()
        big = oversized(grouped)
        for name, size in big.items():
            reason = too_large(name, grouped[name], size)
            if not self._started:
                raise ConfigError(reason, field="devices", source=f"backend {rt.backend.name}")
            if ids_changed:
                log.error(
                    "%s; keeping the devices advertised before",
                    reason,
                    extra={"resource": name, "backend": rt.backend.name},
                )
        self._held = (self._held - grouped.keys()) | big.keys()
        return set(big)

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
        """Log a hook's failure: once per hook and device, then ever more rarely while it
        goes on (:class:`~hetero_dp.kits.logs.Repeats`; the rest at debug level). The
        event, which metrics count, is emitted every time."""
        device = getattr(e, "device", None)
        show, left_out = self._repeats.check((rt.backend.name, hook, device))
        extra = {"backend": rt.backend.name, "hook": hook}
        if show:
            more = f" (failed {left_out} more times since the last report)" if left_out else ""
            log.error("%s%s", e, more, extra=extra)
        else:
            log.debug("%s", e, extra=extra)
        observe.emit("hook_error", backend=rt.backend.name, hook=hook, error=str(e))

    # --- discovery and health -------------------------------------------

    async def _discover(self, rt: BackendRuntime) -> None:
        rt.discoveries += 1
        number, started_at = rt.discoveries, rt.tick()
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
        rt.discovered = {d.id: gate_device(d) for d in devices}
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
                await self.publish(rt)

    async def _rediscover_loop(self, rt: BackendRuntime) -> None:
        interval = self.config.rediscover_interval or None
        while True:
            await wait_event(rt.rediscover_wanted, interval)
            rt.rediscover_wanted.clear()
            await self._discover(rt)
            await self.publish(rt)

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
        await self.health.poll(rt)

    def set_health(
        self, backend_name: str, device_id: str, healthy: bool, reason: str = ""
    ) -> None:
        """Record a pushed health event (fans out to slices and replicas) and publish."""
        rt = self.runtimes[backend_name]
        rt.event_health[device_id] = (healthy, reason, rt.tick())
        self._spawn(self.publish(rt))

    # --- watch hooks -----------------------------------------------------

    def _start_watch(self, rt: BackendRuntime) -> None:
        b = rt.backend
        if not b.implements("watch"):
            return
        rt.sink = EventSink(
            asyncio.get_running_loop(),
            lambda i, ok, why: self.set_health(b.name, i, ok, why),
            rt.rediscover_wanted.set,
        )
        HookWatch(rt, self._watch_failed, self._watch_restarted).start()

    def _watch_failed(self, rt: BackendRuntime, e: BaseException) -> None:
        err = BackendError(f"backend {rt.backend.name!r} hook watch raised {e!r}")
        self._hook_error(rt, "watch", err)
        rt.faults["watch"] = f"health watcher failed: {e!r}"
        self._spawn(self.publish(rt))

    def _watch_restarted(self, rt: BackendRuntime) -> None:
        if rt.faults.pop("watch", None):
            log.info("restarted the health watcher of backend %r", rt.backend.name)
            self._spawn(self.publish(rt))

    # --- reconfiguration (engine/reconfigure.py) --------------------------

    async def apply_config(self, new: Config) -> dict[str, list[str]]:
        """Apply a new config while running; ConfigError (and the old one kept) if it cannot."""
        from hetero_dp.engine.reconfigure import apply_config

        return await apply_config(self, new)

    # --- shutdown --------------------------------------------------------

    def request_stop(self) -> None:
        self._stop_event.set()

    async def wait_stopped(self) -> None:
        await self._stop_event.wait()

    async def stop(self) -> None:
        """End streams, stop servers, remove own sockets, shut backends down."""
        for ext in reversed(self.extensions):
            await ext.stop()
        for rt in self.runtimes.values():
            if rt.sink is not None:
                rt.sink.stopping.set()
            if rt.watch_task is not None:
                rt.watch_task.cancel()
        left = await cancel_and_wait(self._tasks, STOP_TIMEOUT)
        if left:  # they end at their next stop check; shutdown goes on meanwhile
            log.error("tasks %s did not end within %.0fs of stopping", left, STOP_TIMEOUT)
        self._tasks.clear()
        if self._dir_watch is not None:
            self._dir_watch.close()
            self._dir_watch = None
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

    def _take_held_signals(self) -> None:
        """Act on signals :func:`hetero_dp.kits.signals.hold_signals` recorded before the
        loop ran: SIGTERM or SIGINT stops (after start-up, which is not interrupted
        halfway); a SIGHUP is only logged, the config just read being the newest."""
        for sig in held():
            name = signal.Signals(sig).name
            if sig == signal.SIGHUP:
                log.info("%s during start-up: the config read at start-up is applied", name)
            else:
                log.info("%s during start-up: stopping once started", name)
                self.request_stop()

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT, then stop cleanly."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        self._take_held_signals()
        try:
            await self.start()
            log.info("serving %s", ", ".join(sorted(self.resources)) or "no resources yet")
            await self.wait_stopped()
            log.info("stopping")
        finally:
            await self.stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
