"""The udev backend's doctor checks: its settings and rules, each rule's devices,
nodes and companions, and what looks past the rules: accelerators on the PCI bus
that no rule matched."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import pyudev

from hetero_dp import Check, ConfigError

from .discovery import Found, attribute, scan_rule
from .health import checked_host_root, node_missing
from .rules import load_rules, shipped_rule_sets
from .scanning import NOT_EXPECTED, expected

if TYPE_CHECKING:
    from .backend import UdevOptions

# PCI vendors of accelerators, and what drives them here (the PCI ID Repository,
# pci-ids.ucw.cz; docs/sources.md#accelerator-sysfs).
ACCELERATOR_VENDORS = {
    0x1002: "AMD: shipped rule set amd-gpu",
    0x10DE: "NVIDIA: the nvidia backend (hetero-dp run nvidia)",
    0x19E5: "Huawei: shipped rule set ascend-npu",
    0x1DA3: "Habana: shipped rule set gaudi",
    0x10EE: "Xilinx: shipped rule set xilinx-fpga",
}
# PCI base classes that are never the accelerator itself: storage, network,
# multimedia (a GPU's HDMI audio), bridges, serial buses (PCI ID database).
NOT_ACCELERATORS = {0x01, 0x02, 0x04, 0x06, 0x0C}
PROCESSING_ACCELERATOR = 0x12
DISPLAY = 0x03


def _hex(dev: pyudev.Device, name: str) -> int | None:
    value = attribute(dev, name)
    try:
        return int(value, 16) if value else None
    except ValueError:
        return None


def unmatched_accelerators(context: pyudev.Context, found: Iterable[Found]) -> list[str]:
    """PCI functions that look like accelerators (class processing accelerator, any
    vendor; or a function of a known accelerator vendor that is not storage,
    network, audio, a bridge or a bus controller) which no rule matched and which
    are not another function of a matched card, each with the fix."""
    matched = {f.pci_syspath for f in found if f.pci_syspath}
    # another function of a matched card (an FPGA's management function) is part of it
    slots = {path.rsplit(".", 1)[0] for path in matched}
    out = []
    for dev in context.list_devices(subsystem="pci"):
        if dev.sys_path in matched or dev.sys_path.rsplit(".", 1)[0] in slots:
            continue
        vendor, klass = _hex(dev, "vendor"), _hex(dev, "class")
        if vendor is None or klass is None:
            continue
        base = klass >> 16
        known = ACCELERATOR_VENDORS.get(vendor)
        if base != PROCESSING_ACCELERATOR and (known is None or base in NOT_ACCELERATORS):
            continue
        hint = known or "no shipped rule set: write a rule (docs/udev.md)"
        driver = dev.driver or "no driver"
        out.append(f"{dev.sys_name} (vendor 0x{vendor:04x}, class 0x{klass:06x}, {driver}): {hint}")
    return out


def rule_checks(options: UdevOptions, reported_empty: set[str]) -> Iterator[Check]:
    """The doctor's checks of the udev backend: hostRoot, the rules, libudev, then per
    rule its devices, their nodes and companions, and the accelerators no rule
    matched. A rule that matches nothing goes into ``reported_empty`` (discovery,
    which doctor runs next, then does not log it again)."""
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
            reported_empty.add(rule.where)
            if not expected(rule.resource, options.expect):
                yield Check(
                    f"{rule.label} devices",
                    "pass",
                    f"{rule.where} matches no device{NOT_EXPECTED}",
                )
                continue
            # a name written out in expect (not a glob) is required for readiness
            unready = (
                f"; {rule.resource} is named in udev.expect, so the plugin is not ready "
                "until some rule finds one"
                if rule.resource in options.expect
                else ""
            )
            yield Check(
                f"{rule.label} devices",
                "warn",
                f"{rule.where} matches no device{unready}",
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
