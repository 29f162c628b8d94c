"""A umockdev device file from ``udevadm info --export-db``: test rules without the hardware.

On the machine that has the device, ``udevadm info --export-db > node.db`` writes
udev's database as text, one block per device (udevadm(8): ``P:`` the device path
under /sys, ``N:`` the node name under /dev, ``E:`` a property, ``V:`` the bound
driver, ``S:``/``L:``/``M:``/``R:``/``U:``/``T:``/``D:``/``I:``/``Q:``/``J:`` the rest).
umockdev reads a device tree from text too (umockdev-record(1): ``P:`` path, ``N:``
node, ``E:`` property, ``A:`` sysfs attribute, ``L:`` sysfs link), and
``umockdev-run --device FILE -- COMMAND`` makes real libudev, so the udev backend, see
only that tree. ``umockdev-record /dev/... > FILE`` on the device's own machine is the
better source where umockdev is installed there (it copies every sysfs attribute);
the database is what every udev machine has.

What the database does not hold is derived from the properties udev put there:
``A: dev`` from ``MAJOR``/``MINOR``; a PCI function's ``vendor``, ``device`` and
``class`` attributes from ``PCI_ID`` and ``PCI_CLASS`` (the kernel's PCI uevent,
drivers/pci/pci-driver.c ``pci_uevent``); the ``driver`` link from ``DRIVER`` (or the
``V:`` line). Other attributes a rule may match (``numa_node``, ``dev_id``, ...) are not
in the database: add ``A:`` lines by hand. Usage::

    python -m hetero_dp_udev.exportdb node.db --keep 'amdgpu|kfd' > node.umockdev
    umockdev-run --device node.umockdev -- hetero-dp list udev -o udev.rules=amd-gpu
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable

#: Larger than any node's database (tens of thousands of devices are a few MiB).
MAX_BYTES = 64 << 20


def blocks(text: str) -> Iterable[dict[str, list[str]]]:
    """The database's device blocks: tag -> values, in order."""
    block: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.strip():
            if block:
                yield block
            block = {}
            continue
        tag, sep, value = line.partition(": ")
        if sep and len(tag) == 1:
            block.setdefault(tag, []).append(value)
    if block:
        yield block


def _props(block: dict[str, list[str]]) -> dict[str, str]:
    return dict(e.partition("=")[::2] for e in block.get("E", []))


def device(block: dict[str, list[str]]) -> str | None:
    """One umockdev block for a database block (None: no device path)."""
    paths = block.get("P")
    if not paths or not paths[0].startswith("/devices/"):
        return None
    path = paths[0]
    props = _props(block)
    out = [f"P: {path}"]
    if block.get("N"):
        out.append(f"N: {block['N'][0]}")
    out += [f"E: {k}={v}" for k, v in props.items() if k not in ("DEVPATH", "SEQNUM")]
    if "MAJOR" in props and "MINOR" in props:
        out.append(f"A: dev={props['MAJOR']}:{props['MINOR']}")
    pci_id = re.fullmatch(r"([0-9A-Fa-f]{4}):([0-9A-Fa-f]{4})", props.get("PCI_ID", ""))
    if pci_id:
        out.append(f"A: vendor=0x{pci_id.group(1).lower()}")
        out.append(f"A: device=0x{pci_id.group(2).lower()}")
    pci_class = re.fullmatch(r"[0-9A-Fa-f]{1,6}", props.get("PCI_CLASS", ""))
    if pci_class:
        out.append(f"A: class=0x{int(pci_class.group(0), 16):06x}")
    driver = props.get("DRIVER") or (block.get("V") or [""])[0]
    subsystem = props.get("SUBSYSTEM")
    if driver and subsystem:
        up = "../" * path.count("/")  # from /sys<path> back to /sys
        out.append(f"L: driver={up}bus/{subsystem}/drivers/{driver}")
    return "\n".join(out)


def convert(text: str, keep: str | None = None) -> str:
    """The umockdev file for a database: every device, or those whose block matches
    ``keep`` (a regex searched in the block's text) and the devices above them; parents
    first, as umockdev builds the tree in file order."""
    found = {b["P"][0]: b for b in blocks(text) if b.get("P")}
    wanted = set(found)
    if keep is not None:
        pattern = re.compile(keep)
        hits = {
            p
            for p, b in found.items()
            if pattern.search("\n".join(f"{t}: {v}" for t, vs in b.items() for v in vs))
        }
        wanted = {p for p in found if any(h == p or h.startswith(p + "/") for h in hits)}
    made = [device(found[p]) for p in sorted(wanted, key=lambda p: (p.count("/"), p))]
    # no comment line: umockdev-run takes a file that starts with its first P: line
    return "\n\n".join(m for m in made if m) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("database", help="udevadm info --export-db output ('-': stdin)")
    parser.add_argument(
        "--keep", help="only devices whose block matches this regex, and their parents"
    )
    args = parser.parse_args(argv)
    source = sys.stdin if args.database == "-" else open(args.database, encoding="utf-8")  # noqa: SIM115
    with source:
        text = source.read(MAX_BYTES + 1)
    if len(text) > MAX_BYTES:
        print(f"exportdb: {args.database} is over {MAX_BYTES >> 20} MiB", file=sys.stderr)
        return 2
    try:
        out = convert(text, args.keep)
    except re.error as e:
        print(f"exportdb: --keep {args.keep!r}: {e}", file=sys.stderr)
        return 2
    if not out.strip():
        print("exportdb: no device matched", file=sys.stderr)
        return 1
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
