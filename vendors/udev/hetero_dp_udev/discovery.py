"""Enumerate udev devices with pyudev (libudev) and turn matches into device records.

Everything is read through libudev, never by walking ``/sys`` by hand, so the
same code runs against a real host and against a umockdev testbed.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import pyudev

from hetero_dp import Device, DeviceNode, resource_name_problem

from .entries import attribute_name_problem
from .ruletypes import Companion, Match, Rule, render, template_fields

log = logging.getLogger("hetero_dp_udev")

SERIAL_ATTRIBUTES = ("serial_number", "serial", "unique_id")
SERIAL_PROPERTIES = ("ID_SERIAL_SHORT", "ID_SERIAL")


@dataclass
class Found:
    """One matched udev device and what the backend needs to check it later."""

    rule: Rule
    id: str
    syspath: str
    pci_syspath: str | None
    driver: str | None
    driver_syspath: str | None
    nodes: list[str]
    values: dict[str, object]
    numa: int | None
    attributes: dict[str, str | int]
    related: set[str] = field(default_factory=set)
    index: int | None = None
    by_order: bool = False  # the index is the position in the rule's sorted list
    missing: list[str] = field(default_factory=list)  # companions that found no node
    resource: str = ""  # the rule's resource, rendered where it is a template

    @property
    def key(self) -> tuple[str, str]:
        return (self.resource, self.id)


def natural_key(text: str) -> tuple[object, ...]:
    """Sort ``accel2`` before ``accel10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def attribute(dev: pyudev.Device, name: str) -> str | None:
    """A sysfs attribute as stripped text, or None when absent or unreadable. A name
    whose first part is a glob (``rom.*/VBNV``) reads it under the first matching
    subdirectory, in sorted order."""
    if attribute_name_problem(name):
        return None  # refused at load; never read a path out of the device's directory
    head, slash, rest = name.partition("/")
    if slash and any(c in head for c in "*?["):
        try:
            entries = sorted(os.listdir(dev.sys_path))
        except OSError:
            return None
        subdirs = [e for e in entries if fnmatchcase(e, head)]
        if not subdirs:
            return None
        name = f"{subdirs[0]}/{rest}"
    if "/" in name and not _inside_sysfs(dev, name):
        return None
    try:
        return str(dev.attributes.asstring(name)).strip()
    except (KeyError, OSError, UnicodeDecodeError):
        return None


def _inside_sysfs(dev: pyudev.Device, name: str) -> bool:
    """Whether the attribute's file, links resolved, is in sysfs: a name through a
    link of the device's directory (``device/vendor``) reads another sysfs
    directory, never a host file (a fake sysfs could hold a link to /etc)."""
    root = os.path.realpath(dev.context.sys_path)
    real = os.path.realpath(os.path.join(dev.sys_path, name))
    return real.startswith(root.rstrip("/") + "/")


def pci_device(dev: pyudev.Device) -> pyudev.Device | None:
    """The device itself when it is a PCI function, else its nearest PCI ancestor."""
    node: pyudev.Device | None = dev
    while node is not None:
        if node.subsystem == "pci":
            return node
        node = node.parent
    return None


def usb_device(dev: pyudev.Device) -> pyudev.Device | None:
    """The USB device a node hangs off (a serial adapter, a camera), if any: its IDs
    describe the device better than those of the PCI host controller above it."""
    node: pyudev.Device | None = dev
    while node is not None and node.subsystem != "pci":
        if node.subsystem == "usb" and node.device_type == "usb_device":
            return node
        node = node.parent
    return None


def _hex_id(dev: pyudev.Device | None, name: str) -> int | None:
    value = attribute(dev, name) if dev is not None else None
    try:
        return int(value, 16) if value else None
    except ValueError:
        return None


def device_ids(dev: pyudev.Device, pci: pyudev.Device | None) -> tuple[int | None, int | None]:
    """Vendor and device ID: the USB device's (``idVendor``/``idProduct``) when the node
    hangs off one, else the nearest PCI device's (``vendor``/``device``)."""
    usb = usb_device(dev)
    if usb is not None:
        return _hex_id(usb, "idVendor"), _hex_id(usb, "idProduct")
    return _hex_id(pci, "vendor"), _hex_id(pci, "device")


def driver_owner(dev: pyudev.Device, pci: pyudev.Device | None) -> pyudev.Device:
    """The device whose driver counts: the PCI function when there is one (an accel or
    drm node's driver is its PCI function's), else the device itself. Never an
    ancestor further up: after an unbind the function has no ``driver`` link while
    its bridge still has one (``pcieport``), docs/sources.md#unbound-device."""
    return pci if pci is not None else dev


def _driver_ok(driver: str | None, globs: frozenset[str]) -> bool:
    return bool(driver) and any(fnmatchcase(str(driver), g) for g in globs)


def could_match(dev: pyudev.Device, match: Match, pci: pyudev.Device | None) -> bool:
    """The conditions of ``match`` that stay true or false for a device's lifetime
    (subsystem, kernel name, vendor and device IDs): False means never a match."""
    if match.subsystem and dev.subsystem != match.subsystem:
        return False
    if match.sysname and not any(fnmatchcase(dev.sys_name, g) for g in match.sysname):
        return False
    if match.vendor or match.device:
        vendor, device = device_ids(dev, pci)
        if match.vendor and vendor not in match.vendor:
            return False
        if match.device and device not in match.device:
            return False
    return True


def matches(dev: pyudev.Device, match: Match, pci: pyudev.Device | None) -> bool:
    """Whether one udev device satisfies every condition of ``match``."""
    if not could_match(dev, match, pci):
        return False
    if match.devnode:
        node = dev.device_node
        if not node or not any(fnmatchcase(node, g) for g in match.devnode):
            return False
    if match.driver and not _driver_ok(driver_owner(dev, pci).driver, match.driver):
        return False
    for name, pattern in match.attributes.items():
        if not pattern.matches(attribute(dev, name)):
            return False
    for name, pattern in match.properties.items():
        if not pattern.matches(dev.properties.get(name)):
            return False
    return True


def _candidates(context: pyudev.Context, match: Match) -> Iterator[pyudev.Device]:
    enumerator = context.list_devices()
    if match.subsystem:
        enumerator = enumerator.match_subsystem(match.subsystem)
    if len(match.sysname) == 1:
        enumerator = enumerator.match_sys_name(match.sysname[0])
    return iter(enumerator)


def _companion_roots(
    context: pyudev.Context, dev: pyudev.Device, pci: pyudev.Device | None, scope: str
) -> list[pyudev.Device]:
    if scope == "device" or pci is None:
        return [dev]
    if scope == "pci":
        return [pci]
    # slot: every function of the same PCI slot (an FPGA's management and user functions)
    slot = pci.sys_name.rsplit(".", 1)[0] + "."
    return [d for d in context.list_devices(subsystem="pci") if d.sys_name.startswith(slot)]


def _fits(cand: pyudev.Device, comp: Companion) -> bool:
    if not cand.device_node:
        return False
    if comp.subsystem and cand.subsystem != comp.subsystem:
        return False
    if comp.sysname and not any(fnmatchcase(cand.sys_name, g) for g in comp.sysname):
        return False
    return not comp.devnode or any(fnmatchcase(cand.device_node, g) for g in comp.devnode)


def _companions(
    context: pyudev.Context,
    dev: pyudev.Device,
    pci: pyudev.Device | None,
    comp: Companion,
    index: int | None,
) -> Iterator[pyudev.Device]:
    if comp.everywhere:
        # A virtual device without a parent (Gaudi's accel_controlD<N>): looked up in
        # its subsystem and paired by the number in its name with the device's index.
        if index is None:
            return
        for glob in comp.sysname:
            below = context.list_devices(subsystem=comp.subsystem).match_sys_name(glob)
            for cand in below:
                if cand.sys_number == str(index) and _fits(cand, comp):
                    yield cand
        return
    # Found through the sysfs tree (the PCI device's drm children ...), never by
    # guessing names: card<N> numbering shifts with BMC VGA devices and nvidia-drm.
    for root in _companion_roots(context, dev, pci, comp.scope):
        below = context.list_devices()
        if comp.subsystem:  # let libudev filter while it walks the subtree
            below = below.match_subsystem(comp.subsystem)
        for cand in below.match_parent(root):  # the subtree, root included
            if cand.sys_path != dev.sys_path and _fits(cand, comp):
                yield cand


def describe_companion(position: int, comp: Companion, index: int | None) -> str:
    """A companion entry in words, for doctor: what was looked for, and where."""
    what = " ".join(
        [f"subsystem {comp.subsystem}"] * bool(comp.subsystem)
        + [f"name {'|'.join(comp.sysname)}"] * bool(comp.sysname)
        + [f"node {'|'.join(comp.devnode)}"] * bool(comp.devnode)
    )
    where = {
        "pci": "below the PCI function",
        "device": "below the device",
        "slot": "below any function of the PCI slot",
        "index": f"anywhere, numbered {index if index is not None else '<no index>'}",
    }[comp.scope]
    return f"companions[{position}] ({what}, {where})"


def _first(*values: str | None) -> str | None:
    return next((v for v in values if v), None)


def _serial(dev: pyudev.Device, pci: pyudev.Device | None) -> str | None:
    for holder in (dev, pci):
        if holder is None:
            continue
        for name in SERIAL_ATTRIBUTES:
            if value := attribute(holder, name):
                return value
        for name in SERIAL_PROPERTIES:
            if value := holder.properties.get(name):
                return str(value)
    return None


def _device_id(
    rule: Rule, dev: pyudev.Device, pci: pyudev.Device | None, values: dict[str, object]
) -> str | None:
    if rule.id_kind == "template":
        assert rule.id_template is not None
        if any(values.get(f) in ("", None) for f in template_fields(rule.id_template)):
            return None  # a placeholder without a value would make IDs collide
        return render(rule.id_template, values)
    if rule.id_kind == "pci":
        return pci.sys_name if pci is not None else None
    if rule.id_kind == "node":
        return os.path.basename(dev.device_node) if dev.device_node else None
    if rule.id_kind == "sysname":
        return str(dev.sys_name)
    if rule.id_kind == "serial":
        return _serial(dev, pci)
    assert rule.id_attribute is not None
    return _first(
        attribute(dev, rule.id_attribute),
        attribute(pci, rule.id_attribute) if pci is not None else None,
    )


def _index(
    rule: Rule, dev: pyudev.Device, pci: pyudev.Device | None, order: int
) -> tuple[int | None, bool]:
    """The device's index and whether it came from ``order``."""
    for source in rule.index:
        raw: str | None
        if source == "order":
            return order, True
        if source == "sysnum":
            raw = dev.sys_number
        elif source.startswith("attribute:"):
            name = source.split(":", 1)[1]
            raw = _first(attribute(dev, name), attribute(pci, name) if pci is not None else None)
        elif source.startswith("child:"):
            raw = _child_number(dev, pci, source.split(":", 1)[1])
        else:
            raw = dev.properties.get(source.split(":", 1)[1])
        try:
            return (int(str(raw), 0), False) if raw is not None else (None, False)
        except ValueError:
            continue
    return None, False


def _child_number(dev: pyudev.Device, pci: pyudev.Device | None, subsystem: str) -> str | None:
    """The number in the kernel name of the first device of ``subsystem`` below the
    PCI device (a Gaudi's ``accel<N>``), or None when the driver created none."""
    root = pci if pci is not None else dev
    below = root.context.list_devices().match_subsystem(subsystem).match_parent(root)
    numbers = sorted(int(c.sys_number) for c in below if c.sys_number and c.device_node)
    return str(numbers[0]) if numbers else None


def _product(rule: Rule, dev: pyudev.Device, pci: pyudev.Device | None) -> str:
    """The rule's product name, else the hwdb name or USB product string of the
    device's owner (its USB device, else its PCI device), else ``vendor-device``."""
    if rule.product:
        return rule.product
    usb = usb_device(dev)
    owner = usb if usb is not None else pci
    if owner is not None:
        if name := owner.properties.get("ID_MODEL_FROM_DATABASE"):
            return str(name)
        if owner.subsystem == "usb" and (name := attribute(owner, "product")):
            return name
    vendor, device = device_ids(dev, pci)
    if vendor is not None and device is not None:
        return f"{vendor:04x}-{device:04x}"
    return dev.subsystem or "device"


def sort_key(pci_name: str, sysname: str) -> tuple[str, tuple[object, ...]]:
    return (pci_name, natural_key(sysname))


def _found_sort_key(found: Found) -> tuple[str, tuple[object, ...]]:
    return sort_key(str(found.values.get("pci", "")), str(found.values.get("sysname", "")))


def match_device(context: pyudev.Context, rule: Rule, dev: pyudev.Device) -> Found | None:
    """The record of one device under one rule, or None when it does not match (an
    event's device, looked at alone: no enumeration of the rule's subsystem)."""
    pci = pci_device(dev)
    if not matches(dev, rule.match, pci):
        return None
    return _build_found(context, rule, dev, pci, order=0)


def renumber(items: list[Found]) -> list[Found]:
    """Sort one rule's records as a scan does and give ``order`` indices their
    positions again (devices came or went)."""
    items = sorted(items, key=_found_sort_key)
    for position, item in enumerate(items):
        if item.by_order and item.index != position:
            item.index = position
            item.values["index"] = position
    return items


def scan_rule(context: pyudev.Context, rule: Rule) -> list[Found]:
    """Every device of one rule, sorted (PCI address, then natural kernel name)."""
    hits: list[tuple[pyudev.Device, pyudev.Device | None]] = []
    for dev in _candidates(context, rule.match):
        pci = pci_device(dev)
        if matches(dev, rule.match, pci):
            hits.append((dev, pci))
    hits.sort(key=lambda h: sort_key(h[1].sys_name if h[1] is not None else "", h[0].sys_name))
    out: list[Found] = []
    seen: set[str] = set()
    for dev, pci in hits:
        if rule.limit is not None and len(out) >= rule.limit:
            break
        found = _build_found(context, rule, dev, pci, order=len(out))
        if found is None:
            continue
        if found.id in seen:
            log.warning(
                "%s: device %s has the same ID %r as another device; skipped (choose another id:)",
                rule.where,
                dev.sys_path,
                found.id,
            )
            continue
        seen.add(found.id)
        out.append(found)
    return out


def _build_found(
    context: pyudev.Context,
    rule: Rule,
    dev: pyudev.Device,
    pci: pyudev.Device | None,
    order: int,
) -> Found | None:
    index, by_order = _index(rule, dev, pci, order)
    owner = driver_owner(dev, pci)
    vendor, device = device_ids(dev, pci)
    values: dict[str, object] = {
        "index": "" if index is None else index,
        "pci": pci.sys_name if pci is not None else "",
        "sysname": dev.sys_name,
        "sysnum": dev.sys_number or "",
        "node": os.path.basename(dev.device_node) if dev.device_node else "",
        "serial": _serial(dev, pci) or "",
        "vendor": f"0x{vendor:04x}" if vendor is not None else "",
        "device": f"0x{device:04x}" if device is not None else "",
    }
    for name in rule.template_attributes:
        values[f"attribute:{name}"] = (
            _first(attribute(dev, name), attribute(pci, name) if pci is not None else None) or ""
        )
    device_id = _device_id(rule, dev, pci, values)
    if not device_id:
        log.warning(
            "%s: device %s has no %s for its ID; skipped",
            rule.where,
            dev.sys_path,
            rule.id_template or rule.id_attribute or rule.id_kind,
        )
        return None
    values["id"] = device_id
    resource = _resource(rule, dev, values)
    if resource is None:
        return None
    nodes: list[str] = []
    related = {dev.sys_path}
    if pci is not None:
        related.add(pci.sys_path)
    if rule.primary_node and dev.device_node:
        nodes.append(dev.device_node)
    missing: list[str] = []
    for n, comp in enumerate(rule.companions):
        found_nodes = sorted(
            _companions(context, dev, pci, comp, index), key=lambda d: natural_key(d.device_node)
        )
        if not found_nodes:
            missing.append(describe_companion(n, comp, index))
        for cand in found_nodes:
            related.add(cand.sys_path)
            if cand.device_node not in nodes:
                nodes.append(cand.device_node)
    for template in rule.node_templates:
        path = render(template, values)
        if path not in nodes:
            nodes.append(path)
    numa_text = attribute(pci, "numa_node") if pci is not None else None
    try:
        numa = int(numa_text) if numa_text is not None else None
    except ValueError:
        numa = None
    attrs: dict[str, str | int] = {
        "sysname": dev.sys_name,
        "subsystem": dev.subsystem or "",
        "product": _product(rule, dev, pci),
    }
    if pci is not None:
        attrs["pci"] = pci.sys_name
    if vendor is not None:
        attrs["vendor"] = str(values["vendor"])
    if device is not None:
        attrs["device"] = str(values["device"])
    driver = owner.driver or None
    if driver:
        attrs["driver"] = driver
    if values["serial"]:
        attrs["serial"] = str(values["serial"])
    return Found(
        rule=rule,
        id=device_id,
        syspath=dev.sys_path,
        pci_syspath=pci.sys_path if pci is not None else None,
        driver=driver,
        driver_syspath=owner.sys_path,
        nodes=nodes,
        values=values,
        numa=numa if numa is not None and numa >= 0 else None,
        attributes=attrs,
        related=related,
        index=index,
        by_order=by_order,
        missing=missing,
        resource=resource,
    )


def _resource(rule: Rule, dev: pyudev.Device, values: dict[str, object]) -> str | None:
    """The device's resource name: the rule's, or its template rendered (Xilinx's
    ``xilinx.com/fpga-<VBNV>-<timestamp>``). A rendering the kubelet would refuse
    (the attributes are gone while the driver is unbound) falls back to the name this
    device had before; a device never named is skipped, saying why."""
    if not rule.templated:
        return rule.resource
    name = render(rule.resource, values)
    problem = resource_name_problem(name)
    if problem is None:
        rule.names_seen[dev.sys_path] = name
        return name
    if dev.sys_path in rule.names_seen:
        return rule.names_seen[dev.sys_path]
    log.warning(
        "%s: device %s renders the resource name %r (%s); skipped until its attributes "
        "are there (is its driver bound?)",
        rule.where,
        dev.sys_path,
        name,
        problem,
    )
    return None


def to_device(found: Found, reasons: Iterable[str]) -> Device:
    """The record the framework sees; ``reasons`` empty means healthy."""
    rule = found.rule
    why = "; ".join(reasons)
    nodes = [DeviceNode(host_path=p, permissions=rule.permissions) for p in found.nodes]
    nodes += [
        DeviceNode(host_path=p, permissions=rule.permissions, shared=True)
        for p in rule.shared_nodes
    ]
    return Device(
        id=found.id,
        resource=found.resource,
        healthy=not why,
        reason=why,
        numa_nodes=(found.numa,) if found.numa is not None else (),
        nodes=tuple(nodes),
        mounts=rule.mounts,
        env={k: render(v, found.values) for k, v in rule.env.items()},
        annotations={k: render(v, found.values) for k, v in rule.annotations.items()},
        index=found.index,
        attributes=found.attributes,
    )
