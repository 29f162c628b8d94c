"""The udev backend: hook implementations registered under the ``hetero_dp`` entry point.

``configure`` loads the rules, ``discover`` enumerates with pyudev, ``watch`` puts a
``pyudev.Monitor`` on the event loop (``loop.add_reader``, no polling), and
``check_health`` / ``labels`` / ``doctor`` answer from the same records.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyudev

from hetero_dp import Check, ConfigError, Device, EventSink, hookimpl

from .discovery import Found, scan_rule, to_device
from .health import problems
from .rules import Rule, load_rules, shipped_rule_sets

log = logging.getLogger("hetero_dp_udev")

OPTION_KEYS = {"rules", "names"}
HEALTH_ACTIONS = {"change", "bind", "unbind", "online", "offline"}
MAX_SCANS = 3

Key = tuple[str, str]


class UdevBackend:
    """One instance serves every rule of one rules configuration."""

    hetero_dp_name = "udev"  # the backend's name when it is passed as an object

    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self._local = threading.local()  # libudev contexts are not thread-safe: one per thread
        self._lock = threading.Lock()
        self._found: dict[Key, Found] = {}
        self._known_nodes: dict[Key, list[str]] = {}
        self._last: dict[Key, str] = {}  # last reported reason; "" = healthy
        self._scanned_once = False
        self._events: EventSink | None = None
        self._reconfigured: Callable[[], object] | None = None  # set while watch runs
        self._event_batches = 0  # bumped on the loop for each batch of uevents

    def _context(self) -> pyudev.Context:
        ctx = getattr(self._local, "context", None)
        if ctx is None:
            ctx = self._local.context = pyudev.Context()
        return ctx

    # ------------------------------------------------------------------ hooks

    @hookimpl
    def configure(self, options: Mapping[str, Any]) -> None:
        unknown = sorted(set(options) - OPTION_KEYS)
        if unknown:
            log.warning("udev backend: ignoring unknown option(s) %s", ", ".join(unknown))
        if options.get("rules") is None:
            raise ConfigError(
                "required: a rules file path or a list of shipped rule sets "
                f"({', '.join(shipped_rule_sets())})",
                field="rules",
            )
        rules = load_rules(options["rules"], names=_names(options))
        with self._lock:
            self.rules = rules
            self._found.clear()
            self._known_nodes.clear()
            self._last.clear()
            self._scanned_once = False
        if self._reconfigured is not None:
            self._reconfigured()

    @hookimpl
    def discover(self) -> list[Device]:
        context = self._context()
        with self._lock:
            previous = dict(self._found)
            known = dict(self._known_nodes)
            first = not self._scanned_once
        # Events handled while scanning may postdate what the scan read (a driver
        # bound again half-way): scan again rather than return a stale verdict.
        for _ in range(MAX_SCANS):
            seen = self._event_batches
            found, devices = self._scan(context, previous, known, warn=first)
            first = False
            if self._event_batches == seen:
                break
        with self._lock:
            before = self._last
            self._found = found
            self._known_nodes = {k: list(f.nodes) for k, f in found.items()}
            self._last = {(d.resource, d.id): "" if d.healthy else d.reason for d in devices}
            self._scanned_once = True
        events = self._events
        if events is not None:
            # A problem reported through the sink stays until the sink says otherwise,
            # so a recovery first seen here is reported there too.
            for device in devices:
                was = before.get((device.resource, device.id), "")
                if device.healthy and was:
                    events.set_health(device.id, True, f"recovered ({was})")
        return devices

    def _scan(
        self,
        context: pyudev.Context,
        previous: Mapping[Key, Found],
        known: Mapping[Key, list[str]],
        warn: bool,
    ) -> tuple[dict[Key, Found], list[Device]]:
        found: dict[Key, Found] = {}
        devices: list[Device] = []
        for rule in self.rules:
            hits = scan_rule(context, rule)
            if warn and not hits:
                log.warning("%s matches no device at start-up", rule.where)
            for item in hits:
                # A node seen before and gone now makes the device Unhealthy rather
                # than silently smaller.
                item.nodes += [n for n in known.get(item.key, []) if n not in item.nodes]
                found[item.key] = item
        # A device that still exists but stopped matching (its driver unbound, say)
        # stays, Unhealthy with the reason; one that left sysfs is removed.
        fresh = set(found)
        for key, item in previous.items():
            if key not in found and os.path.exists(item.syspath):
                found[key] = item
        for key, item in found.items():
            reasons = problems(context, item)
            if key not in fresh and not reasons:
                reasons = [f"{item.syspath} no longer matches {item.rule.where}"]
            if item.rule.wants_nodes and not item.nodes:
                reasons.append("no device nodes found (driver still loading?)")
            devices.append(to_device(item, reasons))
        return found, devices

    @hookimpl
    def check_health(self, device: Device) -> bool | str:
        item = self._found.get((device.resource, device.id))
        if item is None:
            return True  # not ours, or gone: the next discovery settles it
        reasons = problems(self._context(), item)
        return "; ".join(reasons) if reasons else True

    @hookimpl
    async def watch(self, events: EventSink) -> None:
        loop = asyncio.get_running_loop()
        self._events = events
        try:
            while True:  # until cancelled at shutdown
                # A reload's configure (in another thread) replaces the rules: listen
                # again, with the new rules' subsystems and health intervals.
                reconfigured = asyncio.Event()
                self._reconfigured = functools.partial(loop.call_soon_threadsafe, reconfigured.set)
                stop = self._listen(loop, events)
                try:
                    await reconfigured.wait()
                finally:
                    stop()
        finally:
            self._events = None
            self._reconfigured = None

    def _listen(self, loop: asyncio.AbstractEventLoop, events: EventSink) -> Callable[[], None]:
        """Put a monitor for the current rules on the loop and start their health
        timers; returns what undoes both."""
        try:
            monitor = pyudev.Monitor.from_netlink(self._context())
            for subsystem in sorted(self._subsystems() or ()):
                monitor.filter_by(subsystem)
            monitor.start()
        except OSError as exc:
            raise RuntimeError(
                f"cannot listen for udev events: {exc} (in a pod, run with hostNetwork: true)"
            ) from exc
        fd = monitor.fileno()
        loop.add_reader(fd, self._on_readable, monitor, events)
        timers = [
            asyncio.ensure_future(self._periodic(rule, events))
            for rule in self.rules
            if rule.health is not None and rule.health.interval
        ]

        def stop() -> None:
            loop.remove_reader(fd)
            for timer in timers:
                timer.cancel()

        return stop

    @hookimpl
    def labels(self, devices: list[Device]) -> dict[str, str]:
        # The framework labels every resource with <resource>.count (physical devices,
        # which ``devices`` are not when shared) and .product; only "mixed" is ours.
        products: dict[str, set[str]] = defaultdict(set)
        for device in devices:
            if product := device.attributes.get("product"):
                products[device.resource].add(str(product))
        return {f"{r}.product": "mixed" for r, names in sorted(products.items()) if len(names) > 1}

    @hookimpl
    def doctor(self, options: Mapping[str, Any]) -> list[Check]:
        return list(self._doctor(options))

    # ------------------------------------------------------------------ events

    def _subsystems(self) -> set[str] | None:
        """Subsystems worth hearing about, or None for all (a rule without one)."""
        wanted: set[str] = set()
        for rule in self.rules:
            if not rule.match.subsystem:
                return None
            wanted.add(rule.match.subsystem)
            if rule.match.vendor or rule.match.device or rule.match.driver:
                wanted.add("pci")
            for comp in rule.companions:
                if not comp.subsystem:
                    return None
                wanted.add(comp.subsystem)
        return wanted

    def _on_readable(self, monitor: pyudev.Monitor, events: EventSink) -> None:
        batch = False
        while True:
            try:
                dev = monitor.poll(timeout=0)
            except OSError as exc:  # ENOBUFS after an event storm: events were lost
                log.warning("udev monitor: %s; rediscovering", exc)
                dev = None
                batch = self._new_batch(batch)
            if dev is None:
                break
            batch = self._new_batch(batch)
            if dev.action in HEALTH_ACTIONS:
                self._recheck(dev.sys_path, events)
        # Every batch also asks for a discovery, even one of change events only: the
        # framework keeps a discovered Unhealthy verdict until a newer discovery, so
        # the device set must follow health as well as hotplug.
        if batch:
            events.rediscover()

    def _new_batch(self, started: bool) -> bool:
        if not started:  # before any verdict of this batch goes out (see discover)
            self._event_batches += 1
        return True

    def _recheck(self, syspath: str, events: EventSink) -> None:
        for key, item in list(self._found.items()):
            if syspath in item.related:
                self._report(key, item, events, always=True)

    def _report(self, key: Key, item: Found, events: EventSink, always: bool) -> bool:
        """Send the device's health if it changed (or ``always``); True if it changed."""
        reasons = problems(self._context(), item)
        reason = "; ".join(reasons)
        with self._lock:
            before = self._last.get(key, "")
            if reason == before and not always:
                return False
            self._last[key] = reason
        if reason:
            events.set_health(item.id, False, reason)
        else:
            events.set_health(item.id, True, f"recovered ({before})" if before else "")
        return reason != before

    async def _periodic(self, rule: Rule, events: EventSink) -> None:
        assert rule.health is not None and rule.health.interval
        while True:
            await asyncio.sleep(rule.health.interval)  # the rule's check period, not a sync
            changed = [
                self._report(key, item, events, always=False)
                for key, item in list(self._found.items())
                if item.rule is rule
            ]
            if any(changed):  # keep the discovered verdicts in step, as for events
                self._event_batches += 1
                events.rediscover()

    # ------------------------------------------------------------------ doctor

    def _doctor(self, options: Mapping[str, Any]) -> Iterable[Check]:
        try:
            if options.get("rules") is None:
                raise ConfigError("required option", field="rules")
            rules = load_rules(options["rules"], names=_names(options))
        except ConfigError as exc:
            yield Check(
                "udev rules",
                "fail",
                str(exc),
                fix=f"fix the rules, or use shipped rule sets: {', '.join(shipped_rule_sets())}",
            )
            return
        yield Check(
            "udev rules",
            "pass",
            f"{len(rules)} resource(s): " + ", ".join(r.resource for r in rules),
        )
        try:
            context = pyudev.Context()
        except Exception as exc:
            yield Check("libudev", "fail", f"cannot open libudev: {exc}", fix="install libudev1")
            return
        for rule in rules:
            hits = scan_rule(context, rule)
            if not hits:
                yield Check(
                    f"{rule.resource} devices",
                    "warn",
                    f"{rule.where} matches no device",
                    fix="compare the rule's match with `udevadm info -a -p <sysfs path>`",
                )
                continue
            ids = ", ".join(f.id for f in hits)
            yield Check(f"{rule.resource} devices", "pass", f"{len(hits)} device(s): {ids}")
            missing = [n for f in hits for n in f.nodes if not os.path.exists(n)]
            missing += [n for n in rule.shared_nodes if not os.path.exists(n)]
            empty = [f.id for f in hits if rule.wants_nodes and not f.nodes]
            if missing or empty:
                text = "; ".join(
                    ([f"missing nodes: {', '.join(missing)}"] if missing else [])
                    + ([f"no nodes found for {', '.join(empty)}"] if empty else [])
                )
                yield Check(
                    f"{rule.resource} nodes",
                    "fail",
                    text,
                    fix="load the driver, or mount the host's /dev into the plugin's container",
                )
            else:
                yield Check(f"{rule.resource} nodes", "pass", "every device node exists")


def _names(options: Mapping[str, Any]) -> str:
    names = options.get("names", "vendor")
    if not isinstance(names, str):
        raise ConfigError(f"must be vendor or generic, got {names!r}", field="names")
    return names


# The entry point names this module, so its module-level hooks are one shared backend.
hetero_dp_name = "udev"
_backend = UdevBackend()
configure = _backend.configure
discover = _backend.discover
check_health = _backend.check_health
watch = _backend.watch
labels = _backend.labels
doctor = _backend.doctor
