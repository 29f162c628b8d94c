"""Doctor checks that look past the rules: accelerators on the PCI bus that no rule
matched, and companion nodes a rule expects but did not find."""

from __future__ import annotations

from collections.abc import Iterable

import pyudev

from .discovery import Found, attribute

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
