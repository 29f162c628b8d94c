"""The engine: wires backends, resources and one front end together on one event
loop, and owns their lifecycle (start, stop, signals).

The pieces it wires live beside it: each backend's devices and health overlays
(:mod:`.runtime`), its watch hook (:mod:`.watching`), what a publish sends to which
resource (:mod:`.publishing`, pushed by :mod:`.advertising`), the CDI spec files
(:mod:`.cdi_publisher`), a config applied while running (:mod:`.reconfigure`, a
loop over reloadable components), and its long-lived tasks
(:class:`hetero_dp.kits.tasks.Tasks`). How devices reach the kubelet is the front
end's (:mod:`.frontend`): the engine knows no front end by name.

Public surface for front ends and day-two pieces (``hetero_dp.ops``), which the
engine never imports: :attr:`Daemon.resources` and :meth:`Daemon.devices` (what
each resource advertises), :attr:`Daemon.runtimes` (read-only),
:meth:`Daemon.readiness`, :meth:`Daemon.apply_config`,
:meth:`Daemon.request_rediscover`, :meth:`Daemon.add_publisher` /
:meth:`Daemon.remove_publisher`, extensions (:mod:`.extension`), and the events on
:mod:`hetero_dp.kits.observe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Coroutine
from typing import Any

from hetero_dp.engine.advertising import Advertiser
from hetero_dp.engine.backend import Backend
from hetero_dp.engine.cdi_publisher import CDINames, make_cdi_publisher, read_cdi_off
from hetero_dp.engine.claimhooks import ClaimHooks
from hetero_dp.engine.config import Config
from hetero_dp.engine.extension import Extension
from hetero_dp.engine.frontend import FrontEnd, Publisher
from hetero_dp.engine.polling import HealthPolls
from hetero_dp.engine.publishing import check_names
from hetero_dp.engine.required import Requirements
from hetero_dp.engine.resource import Resource
from hetero_dp.engine.runtime import BackendRuntime
from hetero_dp.engine.watching import HookWatch
from hetero_dp.kits import observe
from hetero_dp.kits.aiotools import wait_event
from hetero_dp.kits.limits import check_limits, report_exhaustion
from hetero_dp.kits.logs import Repeats
from hetero_dp.kits.signals import held
from hetero_dp.kits.tasks import Tasks
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError, ConfigError
from hetero_dp.model.events import EventSink

log = logging.getLogger(__name__)

STOP_TIMEOUT = 3.0  # how long stop() waits for the loops it cancelled


class Daemon:
    def __init__(self, config: Config, backends: list[Backend], front_end: FrontEnd) -> None:
        self.config = config
        self.backends = backends
        self.runtimes = {b.name: BackendRuntime(b) for b in backends}
        self.claim_hooks = ClaimHooks(self.runtimes)  # what a claim-based front end calls
        self.cdi_names = CDINames()  # what CDI spec written defines (the writer fills it)
        self.cdi_off: str | None = None  # why the runtime cannot consume CDI (cdi.runtimeConfig)
        self.resources: dict[str, Resource] = {}
        # resources the backends require a device of before ready (required.py)
        self.requirements = Requirements(self.runtimes)
        self.publishers: list[Publisher] = [self.requirements.check]
        self.tasks = Tasks("daemon")
        self.started = False  # the first publishes are done: refusals are logged, not raised
        self._stop_event = asyncio.Event()
        self.ready = asyncio.Event()
        # day-two pieces (metrics, probes, labels, reload) that plug in from above
        self.extensions: list[Extension] = []
        self._repeats = Repeats()  # how often a failing hook is logged
        self.advertiser = Advertiser(self)  # publishes; each resource's settings
        self.health = HealthPolls(self.advertiser.publish, self.hook_error, self.tasks.spawn)
        self.front_end = front_end
        front_end.attach(self)

    def accept_fake_nodes(self, root: str) -> None:
        """Tests and trials: plain files under ``root`` stand for device nodes (the
        container gate refuses them elsewhere, hetero_dp/allocation/gate.py)."""
        for rt in self.runtimes.values():
            rt.fake_node_roots = (root,)

    # --- start-up --------------------------------------------------------

    async def start(self) -> None:
        """Configure, discover, validate, then serve and register. ConfigError = bad setup."""
        report_exhaustion(asyncio.get_running_loop())
        check_limits()  # what any daemon needs, before a port or socket is bound
        await self.front_end.open()
        for rt in self.runtimes.values():
            self.health.wire(rt)
        for b in self.backends:
            b.timeout = self.config.hook_timeout
            await b.configure_from(self.config)
        # a CDI delivery the runtime would ignore falls back (resource.py)
        self.cdi_off = await read_cdi_off(self.config.cdi.runtime_config)
        cdi = make_cdi_publisher(
            self.config.cdi, self.advertiser.settings_for, self.config.source, self.cdi_names
        )
        if cdi is not None:
            self.publishers.append(cdi)
        # The config is checked (backends' options, cdi.dir) before any port is bound;
        # then probes, before discovery: /readyz says "starting" meanwhile.
        for ext in self.extensions:
            await ext.start()
        for rt in self.runtimes.values():
            await rt.discover(functools.partial(self.hook_error, rt))
        found = {rt.backend.name: rt.discovered.values() for rt in self.runtimes.values()}
        check_names(found, self.config.sharing)
        for rt in self.runtimes.values():
            await self.advertiser.publish(rt)
        if cdi is not None and cdi.unusable is not None:  # specs are needed and cannot be
            raise ConfigError(cdi.unusable.reason, field="cdi.dir", source=self.config.source)
        self.started = True
        self.requirements.arm()
        # what these resources need, before the first registration: none, or all of them
        check_limits(len(self.resources), sum(len(rt.discovered) for rt in self.runtimes.values()))
        await self.front_end.serve()
        for rt in self.runtimes.values():
            self._start_watch(rt)
        self.restart_loops(None, self.config)
        self.ready.set()

    def restart_loops(self, old: Config | None, new: Config) -> None:
        """(Re)start the health poll and rediscovery loops whose interval changed."""
        if old is None or old.health_interval != new.health_interval:
            self.tasks.cancel("health poll")
            if new.health_interval > 0:
                self.tasks.start("health poll", self._health_loop())
        if old is None or old.rediscover_interval != new.rediscover_interval:
            for rt in self.runtimes.values():
                if old is not None:
                    # The old loop may be cancelled inside a rediscover it had taken the
                    # request for (a watch hook's "the device set changed"): do it again.
                    rt.rediscover_wanted.set()
                self.tasks.start(f"rediscover {rt.backend.name}", self._rediscover_loop(rt))

    # --- the public surface for front ends and day-two pieces -------------------

    def devices(self, resource: str) -> list[Device]:
        """What ``resource`` advertises now (replicas included), or [] if unknown."""
        res = self.resources.get(resource)
        return list(res.state.devices) if res is not None else []

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, one line per resource or driver) for ``/readyz`` and ``doctor``: the
        front end's, and not ready while a resource that a backend requires has no
        device (:mod:`.required`)."""
        if not self.ready.is_set():
            return False, ["daemon: starting"]
        ok, lines = self.front_end.readiness()
        missing = self.requirements.missing()
        if not missing:
            return ok, lines
        # its own line replaces the front end's ("ready (0 devices)", "no resources")
        said = ("no resources:", *(f"{name}: " for name in missing))
        return False, [line for line in lines if not line.startswith(said)] + [*missing.values()]

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

    # --- resources -------------------------------------------------------

    def hook_error(self, rt: BackendRuntime, hook: str, e: Exception) -> None:
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

    async def rediscover(self, backend_name: str | None = None) -> None:
        """Discover again now (all backends, or one) and publish the result."""
        for rt in self.runtimes.values():
            if backend_name is None or rt.backend.name == backend_name:
                await rt.discover(functools.partial(self.hook_error, rt))
                await self.advertiser.publish(rt)

    async def _rediscover_loop(self, rt: BackendRuntime) -> None:
        interval = self.config.rediscover_interval or None
        while True:
            await wait_event(rt.rediscover_wanted, interval)
            rt.rediscover_wanted.clear()
            await self._surviving(
                f"rediscovery of {rt.backend.name}", self.rediscover(rt.backend.name)
            )

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval)  # the poll period, not a sync
            await self._surviving("health poll", self.poll_health())

    async def _surviving(self, what: str, work: Coroutine[Any, Any, None]) -> None:
        """Run one round of a loop; an exception is logged (as a failing hook is, not
        on every round) and the loop goes on: a loop that ended would leave devices
        unpolled, or the device set unfollowed, in silence."""
        try:
            await work
        except Exception as e:
            show, left_out = self._repeats.check(("loop", what, repr(e)))
            if show:
                more = f" ({left_out} repeats not logged)" if left_out else ""
                log.error("%s failed, tried again next round%s", what, more, exc_info=e)

    async def poll_health(self) -> None:
        """Run every backend's check_health over its devices once, concurrently."""
        await asyncio.gather(
            *(
                self.health.poll(rt)
                for rt in self.runtimes.values()
                if rt.backend.implements("check_health")
            )
        )

    def set_health(
        self, backend_name: str, device_id: str, healthy: bool, reason: str = ""
    ) -> None:
        """Record a pushed health event (fans out to slices and replicas) and publish."""
        rt = self.runtimes[backend_name]
        rt.event_health[device_id] = (healthy, reason, rt.tick())
        self.tasks.spawn(self.advertiser.publish(rt))

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
        self.hook_error(rt, "watch", err)
        rt.faults["watch"] = f"health watcher failed: {e!r}"
        self.tasks.spawn(self.advertiser.publish(rt))

    def _watch_restarted(self, rt: BackendRuntime) -> None:
        if rt.faults.pop("watch", None):
            log.info("restarted the health watcher of backend %r", rt.backend.name)
            self.tasks.spawn(self.advertiser.publish(rt))

    # --- reconfiguration (engine/reconfigure/) ------------------------------

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
        left = await self.tasks.stop(STOP_TIMEOUT)
        if left:  # they end at their next stop check; shutdown goes on meanwhile
            log.error("tasks %s did not end within %.0fs of stopping", left, STOP_TIMEOUT)
        await self.front_end.stop()
        for rt in self.runtimes.values():
            if rt.watch_task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await rt.watch_task
            if rt.watch_thread is not None:  # it may still be inside a vendor call
                await asyncio.get_running_loop().run_in_executor(None, rt.watch_thread.join, 5)
            try:
                await rt.backend.call("shutdown")
            except BackendError as e:
                self.hook_error(rt, "shutdown", e)
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
