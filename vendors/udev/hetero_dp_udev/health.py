"""Health of one discovered device: still present, driver bound, nodes there,
optional sysfs attribute as expected.

Each check is a handful of sysfs reads through libudev and ``stat`` calls on the
nodes: microseconds, so the watcher runs it on the event loop directly.
"""

from __future__ import annotations

import os
from fnmatch import fnmatchcase

import pyudev

from hetero_dp import ConfigError

from .discovery import Found, attribute


def _device(context: pyudev.Context, syspath: str) -> pyudev.Device | None:
    try:
        return pyudev.Devices.from_sys_path(context, syspath)
    except pyudev.DeviceNotFoundError:
        return None


def driver_problems(context: pyudev.Context, found: Found) -> list[str]:
    """Whether the device's own driver (its PCI function's, never a bridge's) is one
    the rule calls usable. Rules naming no driver are not checked."""
    usable = found.rule.usable_drivers
    if not usable or not found.driver_syspath:
        return []
    owner = _device(context, found.driver_syspath)
    bound = owner.driver if owner is not None else None
    name = os.path.basename(found.driver_syspath)
    wanted = ", ".join(sorted(usable))
    if not bound:
        return [f"no driver bound to {name} (usable: {wanted})"]
    if not any(fnmatchcase(bound, g) for g in usable):
        return [f"{name} is bound to {bound}, not a usable driver ({wanted})"]
    return []


def seen_at(host_root: str, node: str) -> str:
    """Where this process finds the host's device node ``node`` (``/dev/...``, as
    libudev names it): under ``host_root``, the directory the host's ``/`` is mounted
    at (``/host`` when the pod mounts the host's /dev at /host/dev)."""
    if host_root in ("", "/"):
        return node
    return os.path.join(host_root, node.lstrip("/"))


def node_missing(host_root: str, node: str) -> bool:
    return not os.path.exists(seen_at(host_root, node))


def _where(host_root: str, node: str) -> str:
    seen = seen_at(host_root, node)
    return node if seen == node else f"{node} (looked for at {seen})"


def problems(
    context: pyudev.Context,
    found: Found,
    nodes: list[str] | None = None,
    host_root: str = "/",
) -> list[str]:
    """Why the device is unhealthy; an empty list means healthy.

    ``nodes`` are the per-device nodes to expect (defaults to those found at
    discovery; the backend adds nodes it saw earlier and that have since gone).
    Nodes are host paths, looked for under ``host_root`` (see :func:`seen_at`).
    """
    out: list[str] = []
    dev = _device(context, found.syspath)
    if dev is None:
        return [f"device {found.syspath} is gone"]
    out += driver_problems(context, found)
    for node in nodes if nodes is not None else found.nodes:
        if node_missing(host_root, node):
            out.append(f"device node {_where(host_root, node)} is gone")
    for node in found.rule.shared_nodes:
        if node_missing(host_root, node):
            out.append(f"shared node {_where(host_root, node)} is missing")
    rule = found.rule.health
    if rule is not None:
        target: pyudev.Device | None = dev
        if rule.target == "pci":
            target = _device(context, found.pci_syspath) if found.pci_syspath else None
        value = attribute(target, rule.attribute) if target is not None else None
        if value is None:
            out.append(f"health attribute {rule.attribute} is missing")
        elif not rule.pattern.matches(value):
            out.append(f"health attribute {rule.attribute}={value!r}, expected {rule.pattern}")
    return out


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
