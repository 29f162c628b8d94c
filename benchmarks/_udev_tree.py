"""The udev backend's benchmark node: an 8-GPU umockdev tree, built once, kept on disk.

    umockdev-wrapper python3 -m benchmarks._udev_tree TREE_FILE

loads TREE_FILE into a fresh umockdev testbed, prints the testbed's directory and
holds the testbed until its stdin closes, so that any process started meanwhile
with ``LD_PRELOAD=libumockdev-preload.so.0 UMOCKDEV_DIR=<that directory>`` sees
the tree (the daemon and, for a fair floor, the floor too). It must stay alive:
umockdev backs the tree's character devices with ptys whose master ends it
holds. At EOF it tears the testbed (and its directory) down.

Which tree: the trees in ``tests/udev/data`` belong to the udev backend's tests
and change with them, so the benchmark names one (``TREE``) and the device it
counts (``DRIVER``) here, in one place. When the named tree holds fewer than
``DEVICES`` such devices, :func:`grow` adds copies of the tree's own first
device (its PCI function, its upstream bridge and its children: the DRM nodes),
each under a root complex of its own with fresh bus numbers and DRM minors.
Every other fact (attributes, drivers, node names) is the tree's, and so its
sources are the tree's; the layout of the copies (one GPU behind its own root
port, as on 8-GPU MI210/MI250 servers) is a guess.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "udev" / "data"
TREE = "amd-gpu"  # tests/udev/data/<TREE>.umockdev
RULES = "amd-gpu"  # the shipped rule set that serves it (hetero_dp_udev/rulesets)
DRIVER = "amdgpu"  # the driver of the devices it counts
RESOURCE = "amd.com/gpu"
DEVICES = 8


def _records(text: str) -> list[str]:
    return [r.strip() for r in re.split(r"\n\s*\n", text) if r.strip()]


def _path(record: str) -> str:
    return record.splitlines()[0].removeprefix("P: ").strip()


def grow(text: str, driver: str = DRIVER, count: int = DEVICES) -> str:
    """The tree with copies of its first ``driver`` device until it holds ``count``."""
    records = _records(text)
    devices = [r for r in records if f"E: DRIVER={driver}" in r.splitlines()]
    if not devices:
        raise ValueError(f"the tree has no device with DRIVER={driver}")
    if len(devices) >= count:
        return text
    first = _path(devices[0])  # /devices/pci0000:40/0000:40:01.1/0000:43:00.0
    parts = first.split("/")
    root, bridge = parts[2], parts[3]
    family = [r for r in records if _path(r) == "/".join(parts[:4]) or _path(r).startswith(first)]
    used = {int(n) for n in re.findall(r"MINOR=(\d+)", text)}
    used_buses = {int(b, 16) for b in re.findall(r"pci0000:([0-9a-f]{2})", text)}
    out = [text.rstrip()]
    for k in range(count - len(devices)):
        bus = next(b for b in range(0x10, 0xFF, 0x08) if b not in used_buses)
        used_buses.add(bus)
        copy = "\n\n".join(family)
        new_root = f"pci0000:{bus:02x}"
        new_bridge = f"0000:{bus:02x}:{bridge.split(':', 1)[1].split(':', 1)[1]}"
        new_dev = f"0000:{bus + 3:02x}:00.0"
        copy = copy.replace(parts[4], new_dev).replace(bridge, new_bridge)
        copy = copy.replace(root, new_root)
        suffix = f"{k + 16:02x}"
        copy = re.sub(r"unique_id=(\w+)\w\w", rf"unique_id=\g<1>{suffix}", copy)
        mapping: dict[str, str] = {}
        for name in sorted(set(re.findall(r"\b(?:card|renderD)\d+\b", copy))):
            # a DRM node's number is its minor, for card<N> and renderD<N> alike
            kind, number = re.sub(r"\d+$", "", name), int(re.sub(r"^\D+", "", name))
            new = number + 16 * (k + 1)
            while new in used:
                new += 1
            used.add(new)
            mapping[name] = f"{kind}{new}"
        for old, new in mapping.items():
            num_old, num_new = re.sub(r"\D", "", old), re.sub(r"\D", "", new)
            copy = re.sub(rf"\b{old}\b", new, copy)
            copy = copy.replace(f"MINOR={num_old}\n", f"MINOR={num_new}\n")
            copy = re.sub(rf"dev=(\d+):{num_old}\b", rf"dev=\g<1>:{num_new}", copy)
        out.append(copy)
    return "\n\n".join(out) + "\n"


def tree_text() -> str:
    return grow((DATA / f"{TREE}.umockdev").read_text(encoding="utf-8"))


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vendors" / "udev"))
    from hetero_dp_udev.testing import Testbed

    with Testbed() as bed:
        bed.add_file(argv[0])
        print(bed.root, flush=True)
        sys.stdin.read()  # until the benchmark closes our stdin
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
