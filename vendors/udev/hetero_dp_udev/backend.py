"""The udev backend: the entry point ``udev`` names the instance :data:`plugin`.

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
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

import pyudev

from hetero_dp import Check, ConfigError, Device, EventSink, hookimpl, option

from .discovery import (
    Found,
    could_match,
    match_device,
    matches,
    pci_device,
    renumber,
    scan_rule,
    to_device,
)
from .doctor import unmatched_accelerators
from .health import node_missing, problems
from .rules import Companion, Rule, load_rules, shipped_rule_sets

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
        "host's /dev at /host/dev)",
    )
    expect: tuple[str, ...] = option(
        ("*",),
        help="the resources (names or globs) every node running this plugin should have: "
        "a rule for one of them that matches no device at start-up is a warning, for any "
        "other an INFO line (a DaemonSet also runs on nodes without some of its "
        "accelerators); [] expects none",
    )


def options(raw: Mapping[str, Any]) -> UdevOptions:
    """:class:`UdevOptions` from a mapping, checked as the framework checks it."""
    from hetero_dp import parse_options

    return parse_options(UdevOptions, raw, field="backends.udev")


HEALTH_ACTIONS = {"change", "bind", "unbind", "online", "offline"}
MAX_SCANS = 3

Key = tuple[str, str]


class UdevBackend:
    """One instance serves every rule of one rules configuration."""

    hetero_dp_name = "udev"  # the backend's name when it is passed as an object

    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self.host_root = "/"  # where the host's / is seen (UdevOptions.host_root)
        self.expect: tuple[str, ...] = ("*",)  # UdevOptions.expect
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
                found, stale = self._scan(context, previous, known, warn=first)
            else:
                found, stale = self._update(context, previous, stale, known, dirty)
            first = False
            if self._event_batches == seen:
                break
            with self._lock:
                dirty, self._dirty = self._dirty, set()
                full, self._full = full or self._full, False
            previous, known = found, {k: list(f.nodes) for k, f in found.items()}
            if not full and not dirty:
                break
        devices = self._verdicts(context, found, stale)
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

    def _scan(
        self,
        context: pyudev.Context,
        previous: Mapping[Key, Found],
        known: Mapping[Key, list[str]],
        warn: bool,
    ) -> tuple[dict[Key, Found], set[Key]]:
        """Every rule, every device: (records, keys of those that stopped matching)."""
        found: dict[Key, Found] = {}
        stale: set[Key] = set()
        for rule in self.rules:
            hits = scan_rule(context, rule)
            if warn and not hits:
                # doctor, which discovers right after its own checks, has said it already
                said = rule.where in self._reported_empty
                if said:
                    level = logging.DEBUG
                elif expected(rule.resource, self.expect):
                    level = logging.WARNING
                else:
                    level = logging.INFO
                log.log(
                    level,
                    "%s matches no device at start-up%s",
                    rule.where,
                    NOT_EXPECTED if level == logging.INFO else "",
                )
            self._take(found, stale, rule, hits, previous, known)
        return found, stale

    def _take(
        self,
        found: dict[Key, Found],
        stale: set[Key],
        rule: Rule,
        hits: Iterable[Found],
        previous: Mapping[Key, Found],
        known: Mapping[Key, list[str]],
    ) -> None:
        """Put one rule's fresh records in ``found``, plus its earlier ones that still
        exist but stopped matching (kept, Unhealthy, so capacity does not silently
        drop; one that left sysfs is removed)."""
        fresh = set()
        for item in hits:
            # A node seen before and gone now makes the device Unhealthy rather
            # than silently smaller.
            item.nodes += [n for n in known.get(item.key, []) if n not in item.nodes]
            found[item.key] = item
            fresh.add(item.key)
        for key, item in previous.items():
            if item.rule is rule and key not in fresh and os.path.exists(item.syspath):
                found[key] = item
                stale.add(key)

    def _update(
        self,
        context: pyudev.Context,
        previous: Mapping[Key, Found],
        stale_before: set[Key],
        known: Mapping[Key, list[str]],
        dirty: Iterable[str],
    ) -> tuple[dict[Key, Found], set[Key]]:
        """Apply events: only the devices they name, and the records those belong to,
        are looked at again; nothing is enumerated unless a rule is order-sensitive."""
        found = dict(previous)
        stale = set(stale_before)
        touched: set[Key] = set()
        whole: list[Rule] = []
        for path in dirty:
            touched |= {k for k, item in previous.items() if _concerns(path, item)}
            dev = _device_at(context, path)
            if dev is None:
                continue
            for rule in self.rules:
                if any(_pairs_with(dev, comp) for comp in rule.companions):
                    # a parentless companion (accel_controlD<N>) came: it belongs to
                    # the device of the same index N
                    touched |= {
                        k
                        for k, item in previous.items()
                        if item.rule is rule and str(item.index) == dev.sys_number
                    }
                if rule.match.subsystem and dev.subsystem != rule.match.subsystem:
                    continue
                item = match_device(context, rule, dev)
                if item is None or item.key in previous:
                    continue
                if rule.order_sensitive:
                    whole.append(rule)
                    continue
                item.nodes += [n for n in known.get(item.key, []) if n not in item.nodes]
                found[item.key] = item
                stale.discard(item.key)
        for key in touched:
            item = previous[key]
            if item.rule.order_sensitive:
                whole.append(item.rule)
                continue
            found.pop(key, None)
            stale.discard(key)
            dev = _device_at(context, item.syspath)
            if dev is None:
                continue  # left sysfs
            again = match_device(context, item.rule, dev)
            if again is None:
                found[key] = item
                stale.add(key)
                continue
            again.nodes += [n for n in known.get(again.key, []) if n not in again.nodes]
            found[again.key] = again
        for rule in {id(r): r for r in whole}.values():
            for key in [k for k, item in found.items() if item.rule is rule]:
                del found[key]
                stale.discard(key)
            self._take(found, stale, rule, scan_rule(context, rule), previous, known)
        return found, stale

    def _verdicts(
        self, context: pyudev.Context, found: dict[Key, Found], stale: set[Key]
    ) -> list[Device]:
        devices: list[Device] = []
        for rule in self.rules:
            mine = renumber([item for item in found.values() if item.rule is rule])
            for item in mine:
                reasons = problems(context, item, host_root=self.host_root)
                if item.key in stale and not reasons:
                    reasons = [f"{item.syspath} no longer matches {item.rule.where}"]
                if item.rule.wants_nodes and not item.nodes:
                    reasons.append("no device nodes found (driver still loading?)")
                devices.append(to_device(item, reasons))
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
        try:
            context = self._context()
            subsystems, unknown = monitor_subsystems(context, self.rules)
            for where in unknown:
                log.warning(
                    "%s names no subsystem and none could be derived from the devices "
                    "present: its hotplug is seen only by the framework's "
                    "rediscoverInterval (name match.subsystem / companions[].subsystem)",
                    where,
                )
            monitor = pyudev.Monitor.from_netlink(context)
            # Never unfiltered: the kernel drops every other subsystem's events
            # (a socket filter), so a storm of NVMe events costs nothing here.
            for subsystem in sorted(subsystems):
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
    def doctor(self, options: UdevOptions) -> list[Check]:
        return list(self._doctor(options))

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

    # ------------------------------------------------------------------ doctor

    def _doctor(self, options: UdevOptions) -> Iterable[Check]:
        try:
            host_root = checked_host_root(options.host_root)
        except ConfigError as exc:
            yield Check("udev hostRoot", "fail", str(exc), fix="set hostRoot to an absolute path")
            return
        try:
            rules = load_rules(options.rules, names=options.names)
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
            f"{len(rules)} resource(s): " + ", ".join(r.label for r in rules),
        )
        try:
            context = pyudev.Context()
        except Exception as exc:
            yield Check("libudev", "fail", f"cannot open libudev: {exc}", fix="install libudev1")
            return
        everything: list[Found] = []
        for rule in rules:
            hits = scan_rule(context, rule)
            everything += hits
            if not hits:
                # said once: discovery, which doctor runs next, does not log it again
                self._reported_empty.add(rule.where)
                if not expected(rule.resource, options.expect):
                    yield Check(
                        f"{rule.label} devices",
                        "pass",
                        f"{rule.where} matches no device{NOT_EXPECTED}",
                    )
                    continue
                yield Check(
                    f"{rule.label} devices",
                    "warn",
                    f"{rule.where} matches no device",
                    fix="compare the rule's match with `udevadm info -a -p <sysfs path>`; a "
                    "node that need not have it: leave its resource out of udev.expect",
                )
                continue
            ids = ", ".join(f.id for f in hits)
            yield Check(f"{rule.label} devices", "pass", f"{len(hits)} device(s): {ids}")
            missing = [n for f in hits for n in f.nodes if node_missing(host_root, n)]
            missing += [n for n in rule.shared_nodes if node_missing(host_root, n)]
            empty = [f.id for f in hits if rule.wants_nodes and not f.nodes]
            if missing or empty:
                text = "; ".join(
                    ([f"missing nodes: {', '.join(missing)}"] if missing else [])
                    + ([f"no nodes found for {', '.join(empty)}"] if empty else [])
                )
                yield Check(
                    f"{rule.label} nodes",
                    "fail",
                    text,
                    fix="load the driver, or mount the host's /dev into the plugin's container"
                    + (f" at {host_root}/dev (hostRoot)" if host_root != "/" else ""),
                )
            else:
                yield Check(f"{rule.label} nodes", "pass", "every device node exists")
            short = [f"{f.id}: {m}" for f in hits for m in f.missing]
            if short:
                yield Check(
                    f"{rule.label} companions",
                    "warn",
                    "expected companion nodes not found: " + "; ".join(short),
                    fix="check the driver created them (`ls -l /sys/class/<subsystem>`); a "
                    "node without a parent device needs scope: index, one in another "
                    "function of the card scope: slot (docs/udev.md)",
                )
        stray = unmatched_accelerators(context, everything)
        if stray:
            yield Check(
                "unmatched accelerators",
                "warn",
                f"{len(stray)} accelerator(s) on the PCI bus match no rule: " + "; ".join(stray),
                fix="add the rule set named for each, or a rule of your own; a device "
                "without a driver needs its driver loaded first",
            )


NOT_EXPECTED = " (none on this node; not a warning, its resource is not in udev.expect)"


def expected(resource: str, patterns: Iterable[str]) -> bool:
    """Whether ``resource`` is one ``udev.expect`` names (a name or a glob)."""
    return any(fnmatchcase(resource, p) for p in patterns)


def checked_host_root(value: str) -> str:
    """``hostRoot`` normalised ("" means "/"), or a ConfigError: it must be absolute."""
    if value in ("", "/"):
        return "/"
    if not value.startswith("/"):
        raise ConfigError(
            f"must be an absolute path (where the host's / is mounted), got {value!r}",
            field="backends.udev.hostRoot",
        )
    return os.path.normpath(value)


def monitor_subsystems(
    context: pyudev.Context, rules: Iterable[Rule]
) -> tuple[set[str], list[str]]:
    """The subsystems whose uevents can change the rules' devices, and where an
    entry names none and none is derived. A missing subsystem is derived from the
    devices present whose node or kernel name fits the entry's globs."""
    wanted: set[str] = set()
    unknown: list[str] = []
    everything: list[pyudev.Device] | None = None

    def derive(devnode: tuple[str, ...], sysname: tuple[str, ...]) -> set[str]:
        nonlocal everything
        if not (devnode or sysname):
            return set()
        if everything is None:
            everything = list(context.list_devices())
        return {
            str(d.subsystem)
            for d in everything
            if d.subsystem
            and (not devnode or any(fnmatchcase(d.device_node or "", g) for g in devnode))
            and (not sysname or any(fnmatchcase(d.sys_name, g) for g in sysname))
        }

    for rule in rules:
        match = rule.match
        if match.subsystem:
            wanted.add(match.subsystem)
        elif derived := derive(match.devnode, match.sysname):
            wanted |= derived
        else:
            unknown.append(rule.where)
        if match.vendor or match.device or rule.usable_drivers:
            wanted.add("pci")  # bind/unbind and hotplug of the PCI function
        for n, comp in enumerate(rule.companions):
            if comp.subsystem:
                wanted.add(comp.subsystem)
            elif derived := derive(comp.devnode, comp.sysname):
                wanted |= derived
            else:
                unknown.append(f"{rule.where} companions[{n}]")
            if comp.scope == "slot":
                wanted.add("pci")
    return wanted, unknown


def _device_at(context: pyudev.Context, syspath: str) -> pyudev.Device | None:
    try:
        return pyudev.Devices.from_sys_path(context, syspath)
    except pyudev.DeviceNotFoundError:
        return None


def _below(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _concerns(path: str, item: Found) -> bool:
    """Whether an event at ``path`` may change ``item``: the device, its PCI
    function, anything below them (a drm child), a companion found earlier, or
    another function of the same slot for slot-scoped companions."""
    if path in item.related or _below(path, item.syspath):
        return True
    pci = item.pci_syspath
    if pci is None:
        return False
    if _below(path, pci):
        return True
    if any(c.scope == "slot" for c in item.rule.companions):
        return path.startswith(pci.rsplit(".", 1)[0] + ".")
    return False


def _pairs_with(dev: pyudev.Device, comp: Companion) -> bool:
    """Whether ``dev`` could be a parentless companion paired by index."""
    return (
        comp.everywhere
        and dev.subsystem == comp.subsystem
        and any(fnmatchcase(dev.sys_name, g) for g in comp.sysname)
    )


# ``udev = "hetero_dp_udev.backend:plugin"``: the instance the daemon runs.
plugin = UdevBackend()
