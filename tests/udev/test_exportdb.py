"""Rules tested without the hardware: udev's database as ``udevadm info --export-db``
prints it, turned into a umockdev device file, and ``hetero-dp list udev`` under
``umockdev-run`` against it (the recipe in docs/udev.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hetero_dp_udev import exportdb

# The database's text form as udevadm(8) documents it (P: device path, M: sysname,
# R: number, U: subsystem, T: devtype, D: node type and major:minor, N: node name,
# L: link priority, S: symlink, V: driver, E: property), for one AMD GPU behind a root
# port, its /dev/kfd (a virtual device, amdkfd/kfd_chardev.c) and a keyboard that is
# not a GPU. The properties are those the kernel's uevents carry (pci_uevent:
# PCI_CLASS, PCI_ID, PCI_SLOT_NAME; drm minors: DEVNAME, DEVTYPE, MAJOR, MINOR).
# Guessed: the bus numbers, the MI210's device ID 0x740f, kfd's major number.
DATABASE = """\
P: /devices/pci0000:40/0000:40:01.1
M: 0000:40:01.1
R: 1
U: pci
V: pcieport
E: DEVPATH=/devices/pci0000:40/0000:40:01.1
E: SUBSYSTEM=pci
E: DRIVER=pcieport
E: PCI_CLASS=60400
E: PCI_ID=1022:1483
E: PCI_SLOT_NAME=0000:40:01.1

P: /devices/pci0000:40/0000:40:01.1/0000:43:00.0
M: 0000:43:00.0
R: 0
U: pci
V: amdgpu
E: DEVPATH=/devices/pci0000:40/0000:40:01.1/0000:43:00.0
E: SUBSYSTEM=pci
E: DRIVER=amdgpu
E: PCI_CLASS=38000
E: PCI_ID=1002:740F
E: PCI_SLOT_NAME=0000:43:00.0

P: /devices/pci0000:40/0000:40:01.1/0000:43:00.0/drm/card1
M: card1
R: 1
U: drm
T: drm_minor
D: c 226:1
N: dri/card1
L: 0
S: dri/by-path/pci-0000:43:00.0-card
E: DEVPATH=/devices/pci0000:40/0000:40:01.1/0000:43:00.0/drm/card1
E: DEVNAME=/dev/dri/card1
E: DEVTYPE=drm_minor
E: MAJOR=226
E: MINOR=1
E: SUBSYSTEM=drm

P: /devices/pci0000:40/0000:40:01.1/0000:43:00.0/drm/renderD128
M: renderD128
R: 128
U: drm
T: drm_minor
D: c 226:128
N: dri/renderD128
E: DEVPATH=/devices/pci0000:40/0000:40:01.1/0000:43:00.0/drm/renderD128
E: DEVNAME=/dev/dri/renderD128
E: DEVTYPE=drm_minor
E: MAJOR=226
E: MINOR=128
E: SUBSYSTEM=drm

P: /devices/virtual/kfd/kfd
M: kfd
U: kfd
D: c 238:0
N: kfd
E: DEVPATH=/devices/virtual/kfd/kfd
E: DEVNAME=/dev/kfd
E: MAJOR=238
E: MINOR=0
E: SUBSYSTEM=kfd

P: /devices/platform/i8042/serio0/input/input3/event2
M: event2
U: input
D: c 13:66
N: input/event2
E: DEVNAME=/dev/input/event2
E: MAJOR=13
E: MINOR=66
E: SUBSYSTEM=input
"""


def test_a_database_becomes_a_umockdev_tree_parents_first():
    out = exportdb.convert(DATABASE)
    paths = [ln[3:] for ln in out.splitlines() if ln.startswith("P: ")]
    assert paths.index("/devices/pci0000:40/0000:40:01.1") < paths.index(
        "/devices/pci0000:40/0000:40:01.1/0000:43:00.0"
    )
    gpu = out.split("P: /devices/pci0000:40/0000:40:01.1/0000:43:00.0\n")[1].split("\n\n")[0]
    assert "A: vendor=0x1002" in gpu and "A: device=0x740f" in gpu
    assert "A: class=0x038000" in gpu
    assert "L: driver=../../../../bus/pci/drivers/amdgpu" in gpu
    card = out.split("P: /devices/pci0000:40/0000:40:01.1/0000:43:00.0/drm/card1\n")[1]
    assert card.startswith("N: dri/card1\n") and "A: dev=226:1" in card.split("\n\n")[0]
    assert "L: 0" not in out  # a database L: is a link priority, not a sysfs link


def test_keep_takes_the_matches_and_their_parents():
    out = exportdb.convert(DATABASE, keep="amdgpu|kfd")
    assert "event2" not in out
    assert "P: /devices/pci0000:40/0000:40:01.1\n" in out  # the GPU's parent stays
    assert "renderD128" not in out  # a child is not a parent: --keep names it if wanted
    assert "P: /devices/virtual/kfd/kfd" in out


def test_bad_input_gets_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    db = tmp_path / "node.db"
    db.write_text(DATABASE)
    assert exportdb.main([str(db), "--keep", "("]) == 2
    assert "--keep '('" in capsys.readouterr().err
    assert exportdb.main([str(db), "--keep", "nothing-like-this"]) == 1
    assert "no device matched" in capsys.readouterr().err


def test_hetero_dp_list_udev_sees_the_gpu_of_the_database(tmp_path: Path, cli_env):
    """The recipe of docs/udev.md end to end: real libudev under umockdev-run."""
    if shutil.which("umockdev-run") is None:
        pytest.skip("umockdev is not installed (apt-get install umockdev libumockdev0)")
    db = tmp_path / "node.db"
    db.write_text(DATABASE)
    tree = tmp_path / "node.umockdev"
    made = subprocess.run(
        [sys.executable, "-m", "hetero_dp_udev.exportdb", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    tree.write_text(made.stdout)
    listed = subprocess.run(
        [
            *("umockdev-run", "--device", str(tree), "--", sys.executable, "-m", "hetero_dp"),
            *("list", "udev", "-o", "udev.rules=amd-gpu", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "0000:43:00.0" in listed.stdout, listed.stdout
    assert "/dev/dri/renderD128" in listed.stdout and "/dev/kfd" in listed.stdout
