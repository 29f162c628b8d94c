"""Facts about a PCI device from sysfs: NUMA node, IDs, driver, IOMMU group.

What a backend usually needs to fill in a :class:`~hetero_dp.model.device.Device`
(``numa_nodes``, ``attributes``) without a vendor library. The files read are
the kernel's documented PCI attributes (Documentation/ABI/testing/sysfs-bus-pci
and sysfs-kernel-iommu_groups):

- ``/sys/bus/pci/devices/<address>/vendor``, ``device``, ``subsystem_vendor``,
  ``subsystem_device``, ``class``: hex numbers, ``0x10de`` ...;
- ``numa_node``: the node number, ``-1`` when the platform gives none
  (NUMA_NO_NODE, drivers/pci/pci-sysfs.c);
- ``driver``: a symlink to ``/sys/bus/pci/drivers/<name>``, absent when no
  driver is bound;
- ``iommu_group``: a symlink to ``/sys/kernel/iommu_groups/<n>``, absent
  without an IOMMU.

A device node's PCI device is found through ``/sys/dev/char/<major>:<minor>``
(Documentation/ABI/testing/sysfs-dev), whose ``device`` link leads into the
device tree; the nearest parent named like a PCI address is the device.

Every function takes ``root`` (``/`` by default) so a container that mounts the
host's sysfs elsewhere, or a test with a fake tree, reads the same way.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# domain:bus:device.function, e.g. 0000:3b:00.0 (lspci -D's form)
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class PciFacts:
    """What sysfs says about one PCI device; a fact sysfs does not have is ``None``."""

    address: str
    vendor: str | None = None  # "0x10de"
    device: str | None = None  # "0x2330"
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    pci_class: str | None = None  # "0x030200"
    numa_node: int | None = None  # None for -1 (no NUMA information)
    driver: str | None = None  # the bound driver's name ("vfio-pci"), None when unbound
    iommu_group: int | None = None

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        """For :class:`Device`'s ``numa_nodes``: ``(n,)`` or ``()``."""
        return () if self.numa_node is None else (self.numa_node,)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _link_name(path: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def pci_device_dir(address: str, root: str | Path = "/") -> Path:
    """The sysfs dir of a PCI device; ValueError for a malformed address,
    FileNotFoundError (naming the path) when there is no such device."""
    address = address.strip().lower()
    if not PCI_ADDRESS.match(address):
        raise ValueError(f"{address!r} is not a PCI address such as 0000:3b:00.0")
    path = Path(root) / "sys/bus/pci/devices" / address
    if not path.exists():
        raise FileNotFoundError(f"no PCI device {address}: {path} does not exist")
    return path


def pci_facts(address: str, root: str | Path = "/") -> PciFacts:
    """Read the facts of the PCI device at ``address`` (``0000:3b:00.0``)."""
    path = pci_device_dir(address, root)
    numa = _read(path / "numa_node")
    group = _link_name(path / "iommu_group")
    return PciFacts(
        address=path.name,
        vendor=_read(path / "vendor"),
        device=_read(path / "device"),
        subsystem_vendor=_read(path / "subsystem_vendor"),
        subsystem_device=_read(path / "subsystem_device"),
        pci_class=_read(path / "class"),
        numa_node=int(numa)
        if numa is not None and numa.lstrip("-").isdigit() and int(numa) >= 0
        else None,
        driver=_link_name(path / "driver"),
        iommu_group=int(group) if group is not None and group.isdigit() else None,
    )


def pci_address_of(device_node: str | Path, root: str | Path = "/") -> str | None:
    """The PCI address of the device behind a character device node (``/dev/acme0``),
    or None when it hangs off no PCI device. The node itself is stat'ed where it is
    (``device_node`` as given); sysfs is read under ``root``."""
    st = os.stat(device_node)
    link = Path(root) / f"sys/dev/char/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" / "device"
    try:
        target = Path(os.path.realpath(link))
    except OSError:
        return None
    if not target.exists():
        return None
    for part in (target, *target.parents):
        if PCI_ADDRESS.match(part.name):
            return part.name
    return None
