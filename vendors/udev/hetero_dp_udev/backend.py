"""The udev backend: the entry point ``udev`` names the instance :data:`plugin`.

``configure`` loads the rules, ``discover`` enumerates with pyudev (a full scan or,
after uevents, an update of what they name: :mod:`.scanning`), ``watch`` puts a
``pyudev.Monitor`` on the event loop (``loop.add_reader``, no polling), and
``check_health`` / ``labels`` / ``doctor`` (:mod:`.doctor`) answer from the same
records. The class keeps the state between calls: the records, what events named
since the last discovery, the health last reported.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pyudev

from hetero_dp import Check, Device, EventSink, hookimpl, option

from .discovery import Found, could_match, matches, pci_device
from .doctor import rule_checks
from .health import checked_host_root, problems
from .monitor import open_monitor
from .rules import Rule, load_rules, shipped_rule_sets
from .scanning import Key, required, scan, update, verdicts

log = logging.getLogger("hetero_dp_udev")


@dataclass(frozen=True)
class UdevOptions:
    """The udev backend's options (``backends.udev``, ``-o udev.KEY=VALUE``)."""

    rules: str | tuple[str, ...] = option(
        help="a rules file path, or shipped rule sets (a list or comma-separated): "
        + ", ".join(shipped_rule_sets())
    )
    names: Literal["vendor", "generic"] = option(
        "vendor",
        help="vendor: the resource names and IDs each vendor's own plugin advertises; "
        "generic: hetero-dp's generic names",
    )
    host_root: str = option(
        "/",
        help="where the host's / is seen by the plugin: a node libudev names /dev/X is "
        "looked for at <hostRoot>/dev/X, while Allocate and CDI specs name /dev/X, the "
        "path the container runtime opens on the host (/host when the pod mounts the "
        "host's /dev at /host/dev); empty means /",
        min=0,  # empty is a documented spelling of the plugin's own root
    )
    expect: tuple[str, ...] = option(
        ("*",),
        help="the resources (names or globs) every node running this plugin should have: "
        "a rule for one of them that matches no device at start-up is a warning, for any "
        "other an INFO line (a DaemonSet also runs on nodes without some of its "
        "accelerators); [] expects none. A name written out (no glob) must also have a "
        "device before the plugin is ready, so a rules typo stalls a rolling update",
    )


def options(raw: Mapping[str, Any]) -> UdevOptions:
    """:class:`UdevOptions` from a mapping, checked as the framework checks it."""
    from hetero_dp import parse_options

    return parse_options(UdevOptions, raw, field="backends.udev")


HEALTH_ACTIONS = {"change", "bind", "unbind", "online", "offline"}
MAX_SCANS = 3


class UdevBackend:
    """One instance serves every rule of one rules configuration."""

    hetero_dp_name = "udev"  # the backend's name when it is passed as an object

    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self.host_root = "/"  # where the host's / is seen (UdevOptions.host_root)
        self.expect: tuple[str, ...] = ("*",)  # UdevOptions.expect
        self.required: dict[str, str] = {}  # what expect names exactly
        self._local = threading.local()  # libudev contexts are not thread-safe: one per thread
        self._lock = threading.Lock()
        self._found: dict[Key, Found] = {}
        self._stale: set[Key] = set()  # still in sysfs but no longer matching
        self._dirty: set[str] = set()  # sysfs paths named by events since the last discovery
        self._never_ours: set[str] = set()  # paths of devices no rule can match (change events)
        self._full = True  # the next discovery scans everything
        self._reported_empty: set[str] = set()  # rules doctor found empty (said once)
        self._batches_seen = 0  # _event_batches when the last discovery started looking
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
    def configure(self, options: UdevOptions) -> None:
        host_root = checked_host_root(options.host_root)
        rules = load_rules(options.rules, names=options.names)
        self.required = required(options.expect, rules)
        with self._lock:
            self.rules = rules
            self.host_root = host_root
            self.expect = tuple(options.expect)
            self._found.clear()
            self._never_ours.clear()
            self._stale.clear()
            self._dirty.clear()
            self._full = True
            self._known_nodes.clear()
            self._last.clear()
            self._scanned_once = False
        if self._reconfigured is not None:
            self._reconfigured()

    @hookimpl
    def required_resources(self) -> dict[str, str]:
        return dict(self.required)  # not ready while one has no device

    @hookimpl
    def discover(self) -> list[Device]:
        context = self._context()
        with self._lock:
            previous = dict(self._found)
            known = dict(self._known_nodes)
            stale = set(self._stale)
            first = not self._scanned_once
            dirty, self._dirty = self._dirty, set()
            # A call with no event behind it (start-up, the framework's interval, a
            # reload) scans everything; a call after events looks only at what
            # they name, so its cost does not grow with the machine. (One batch's
            # discovery may already have taken a later batch's paths: the later
            # call then has nothing to look at, and must not fall back to a scan.)
            after_events = self._event_batches != self._batches_seen
            full = first or self._full or not after_events
            self._full = False
        # Events handled while scanning may postdate what the scan read (a driver
        # bound again half-way): look again rather than return a stale verdict.
        for _ in range(MAX_SCANS):
            seen = self._event_batches
            self._batches_seen = seen
            if full:
                found, stale = scan(
                    context, self.rules, previous, known, first, self._reported_empty, self.expect
                )
            else:
                found, stale = update(context, self.rules, previous, stale, known, dirty)
            first = False
            if self._event_batches == seen:
                break
            with self._lock:
                dirty, self._dirty = self._dirty, set()
                full, self._full = full or self._full, False
            previous, known = found, {k: list(f.nodes) for k, f in found.items()}
            if not full and not dirty:
                break
        devices = verdicts(context, self.rules, found, stale, self.host_root)
        with self._lock:
            before = self._last
            self._found = found
            self._stale = stale
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

    @hookimpl
    def check_health(self, device: Device) -> bool | str:
        item = self._found.get((device.resource, device.id))
        if item is None:
            return True  # not ours, or gone: the next discovery settles it
        reasons = problems(self._context(), item, host_root=self.host_root)
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
        monitor = open_monitor(self._context(), self.rules, self.expect)
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
    def doctor(self, options: UdevOptions) -> list[Check]:
        return list(rule_checks(options, self._reported_empty))

    # ------------------------------------------------------------------ events

    def _on_readable(self, monitor: pyudev.Monitor, events: EventSink) -> None:
        try:
            self._read_events(monitor, events)
        except Exception as exc:
            # One line, not asyncio's traceback per event; a full rescan instead of
            # whatever this batch would have changed.
            log.error("udev monitor: handling events failed (%r); rediscovering all", exc)
            with self._lock:
                self._full = True
            events.rediscover()

    def _read_events(self, monitor: pyudev.Monitor, events: EventSink) -> None:
        batch = False
        received = False
        while True:
            try:
                dev = monitor.poll(timeout=0)
            except OSError as exc:  # ENOBUFS after an event storm: events were lost
                log.warning("udev monitor: %s; rediscovering", exc)
                dev = None
                batch = self._new_batch(batch)
                with self._lock:
                    self._full = True
            if dev is None:
                if not received and not batch:
                    # Readable, yet libudev returned no device: it read a message and
                    # dropped it, so which device changed is unknown. Rescan all.
                    # (Seen under umockdev on Python 3.10 for a remove uevent.)
                    log.debug("udev monitor: a message was dropped; rediscovering all")
                    batch = self._new_batch(batch)
                    with self._lock:
                        self._full = True
                break
            received = True
            if dev.action == "change" and not self._concerns(dev):
                continue  # another device's change (a NIC on the same bus): nothing to do
            self._never_ours.discard(dev.sys_path)  # added or removed: it may be new
            batch = self._new_batch(batch)
            with self._lock:
                self._dirty.add(dev.sys_path)
            if dev.action in HEALTH_ACTIONS:
                self._recheck(dev.sys_path, events)
        # Every batch also asks for a discovery, even one of change events only: the
        # framework keeps a discovered Unhealthy verdict until a newer discovery, so
        # the device set must follow health as well as hotplug.
        if batch:
            events.rediscover()

    def _concerns(self, dev: pyudev.Device) -> bool:
        """Whether a change event can matter: the device belongs to a found device (it,
        its PCI function or a companion node), or it matches a rule (an attribute
        change made it one of ours). Anything else is left alone, no discovery; a
        device no rule could ever match (another vendor's NIC) is remembered as such."""
        path = dev.sys_path
        if path in self._never_ours:
            return False
        if any(path in item.related for item in list(self._found.values())):
            return True
        pci = pci_device(dev)
        if not any(could_match(dev, rule.match, pci) for rule in self.rules):
            self._never_ours.add(path)
            return False
        return any(matches(dev, rule.match, pci) for rule in self.rules)

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
        reasons = problems(self._context(), item, host_root=self.host_root)
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
        failing = ""  # the failure last logged at ERROR: its repeats go to debug
        while True:
            await asyncio.sleep(rule.health.interval)  # the rule's check period, not a sync
            try:
                changed = [
                    self._report(key, item, events, always=False)
                    for key, item in list(self._found.items())
                    if item.rule is rule
                ]
            except Exception as exc:
                level = logging.DEBUG if repr(exc) == failing else logging.ERROR
                failing = repr(exc)
                log.log(level, "%s: health check failed (%r); rediscovering", rule.where, exc)
                changed = [True]  # the discovery judges health again
            else:
                if failing:
                    log.info("%s: health check works again", rule.where)
                failing = ""
            if any(changed):  # keep the discovered verdicts in step, as for events
                self._event_batches += 1
                events.rediscover()


# ``udev = "hetero_dp_udev.backend:plugin"``: the instance the daemon runs.
plugin = UdevBackend()
