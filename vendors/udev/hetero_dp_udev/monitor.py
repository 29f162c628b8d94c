"""The udev backend's uevent monitor: which subsystems can change the rules'
devices, and a netlink monitor filtered to them (the kernel drops every other
subsystem's events), for ``watch`` to put on the event loop."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from fnmatch import fnmatchcase

import pyudev

from .ruletypes import Rule
from .scanning import NOT_EXPECTED, expected

log = logging.getLogger("hetero_dp_udev")


def open_monitor(
    context: pyudev.Context, rules: Iterable[Rule], expect: Iterable[str] = ("*",)
) -> pyudev.Monitor:
    """A started netlink monitor for ``rules``' subsystems (an entry whose subsystem
    is unknown is logged: a warning for a resource ``expect`` names, else INFO, since
    it means only that no such device is present); RuntimeError naming the fix when
    it cannot listen."""
    rules = list(rules)
    patterns = tuple(expect)
    try:
        subsystems: set[str] = set()
        for wanted in (True, False):
            group = [r for r in rules if expected(r.resource, patterns) == wanted]
            found, unknown = monitor_subsystems(context, group) if group else (set(), [])
            subsystems |= found
            for where in unknown:
                log.log(
                    logging.WARNING if wanted else logging.INFO,
                    "%s names no subsystem and none could be derived from the devices "
                    "present: its hotplug is seen only by the framework's "
                    "rediscoverInterval (name match.subsystem / companions[].subsystem)%s",
                    where,
                    "" if wanted else NOT_EXPECTED,
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
    return monitor


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
