"""How a discovery finds the udev backend's devices: a full scan of every rule, or
after uevents an update that looks only at the devices the events name (and the
records those belong to), so its cost does not grow with the machine; then each
record's verdict. Pure functions over the rules and the records: the backend
(:mod:`.backend`) keeps the state between calls and decides which one runs."""

from __future__ import annotations

import logging
import os
from collections.abc import Container, Iterable, Mapping
from fnmatch import fnmatchcase

import pyudev

from hetero_dp import ConfigError, Device

from .discovery import Found, match_device, renumber, scan_rule, to_device
from .health import problems
from .ruletypes import Companion, Rule

log = logging.getLogger("hetero_dp_udev")

Key = tuple[str, str]

NOT_EXPECTED = " (none on this node; not a warning, its resource is not in udev.expect)"


def expected(resource: str, patterns: Iterable[str]) -> bool:
    """Whether ``resource`` is one ``udev.expect`` names (a name or a glob)."""
    return any(fnmatchcase(resource, p) for p in patterns)


def required(patterns: Iterable[str], rules: Iterable[Rule]) -> dict[str, str]:
    """The resources ``udev.expect`` names exactly, each to why: the framework holds
    readiness back while one has no device (the ``required_resources`` hook). A glob
    (``*``, ``?``, ``[``; the default ``["*"]``) only sets how loud an empty rule is:
    it would make a node without some of the rules' hardware unready for good. A name
    that no rule advertises could never be found: a ConfigError naming the closest."""
    advertised = {rule.resource for rule in rules}
    out: dict[str, str] = {}
    for n, pattern in enumerate(patterns):
        if any(c in pattern for c in "*?["):
            continue
        if pattern not in advertised:
            import difflib  # only for a mistake

            near = next(iter(difflib.get_close_matches(pattern, sorted(advertised), 1)), None)
            known = ", ".join(sorted(advertised)) or "none"
            raise ConfigError(
                f"{pattern!r} is not a resource the rules advertise ({known}); "
                + (f"did you mean {near!r}?" if near else "name one of them, or a glob"),
                field=f"backends.udev.expect[{n}]",
            )
        out[pattern] = "udev.expect names it"
    return out


def scan(
    context: pyudev.Context,
    rules: Iterable[Rule],
    previous: Mapping[Key, Found],
    known: Mapping[Key, list[str]],
    warn: bool,
    said: Container[str] = (),
    expect: Iterable[str] = ("*",),
) -> tuple[dict[Key, Found], set[Key]]:
    """Every rule, every device: (records, keys of those that stopped matching). With
    ``warn``, a rule that matches nothing is logged: a warning for a resource
    ``expect`` names (``udev.expect``), else at INFO, and at debug level where
    ``said``, the rules doctor reported empty, holds it."""
    found: dict[Key, Found] = {}
    stale: set[Key] = set()
    for rule in rules:
        hits = scan_rule(context, rule)
        if warn and not hits:
            # doctor, which discovers right after its own checks, has said it already
            if rule.where in said:
                level = logging.DEBUG
            elif expected(rule.resource, expect):
                level = logging.WARNING
            else:
                level = logging.INFO
            log.log(
                level,
                "%s matches no device at start-up%s",
                rule.where,
                NOT_EXPECTED if level == logging.INFO else "",
            )
        take(found, stale, rule, hits, previous, known)
    return found, stale


def take(
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


def update(
    context: pyudev.Context,
    rules: Iterable[Rule],
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
        touched |= {k for k, item in previous.items() if concerns(path, item)}
        dev = _device_at(context, path)
        if dev is None:
            continue
        for rule in rules:
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
        take(found, stale, rule, scan_rule(context, rule), previous, known)
    return found, stale


def verdicts(
    context: pyudev.Context,
    rules: Iterable[Rule],
    found: dict[Key, Found],
    stale: set[Key],
    host_root: str,
) -> list[Device]:
    """The devices of ``found`` in rule order, renumbered, each with its health: a
    problem of its nodes or attributes, a record that stopped matching, no nodes."""
    devices: list[Device] = []
    for rule in rules:
        mine = renumber([item for item in found.values() if item.rule is rule])
        for item in mine:
            reasons = problems(context, item, host_root=host_root)
            if item.key in stale and not reasons:
                reasons = [f"{item.syspath} no longer matches {item.rule.where}"]
            if item.rule.wants_nodes and not item.nodes:
                reasons.append("no device nodes found (driver still loading?)")
            devices.append(to_device(item, reasons))
    return devices


def _device_at(context: pyudev.Context, syspath: str) -> pyudev.Device | None:
    try:
        return pyudev.Devices.from_sys_path(context, syspath)
    except pyudev.DeviceNotFoundError:
        return None


def _below(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def concerns(path: str, item: Found) -> bool:
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
