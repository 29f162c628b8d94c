"""A umockdev testbed driven through ctypes, for tests and benchmarks.

umockdev (Debian packages ``umockdev libumockdev0``) fakes ``/sys``, ``/dev`` and
uevents for real libudev, so pyudev, and so this backend, run unchanged against
a device tree described in a ``.umockdev`` file. Two pieces are needed:

* ``libumockdev-preload.so.0`` must be in ``LD_PRELOAD`` when the process starts
  (``umockdev-wrapper python3 ...``): it redirects libc calls on /sys and /dev.
* ``libumockdev.so.0`` builds the tree; :class:`Testbed` calls it with ctypes, so
  no GObject introspection (``gi``) is needed and any Python works.

Quirks of umockdev 0.17 handled here: ``remove_device`` sends no uevent, leaves
children and leaves the ``/dev`` node behind, so :meth:`Testbed.remove` sends the
remove events itself (children first) and deletes the nodes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
from pathlib import Path
from types import TracebackType

PRELOAD = "libumockdev-preload.so.0"


def under_preload() -> bool:
    """Whether this process started with umockdev's preload library."""
    return "libumockdev-preload" in os.environ.get("LD_PRELOAD", "")


def missing() -> str | None:
    """Why umockdev cannot be used here, or None when it can."""
    if shutil.which("umockdev-wrapper") is None:
        return "umockdev is not installed (apt-get install umockdev libumockdev0)"
    for lib in ("umockdev", "umockdev-preload"):
        if ctypes.util.find_library(lib) is None:
            return f"lib{lib}.so is not installed (apt-get install libumockdev0)"
    return None


class _GError(ctypes.Structure):
    _fields_ = [("domain", ctypes.c_uint32), ("code", ctypes.c_int), ("message", ctypes.c_char_p)]


def _load() -> tuple[ctypes.CDLL, ctypes.CDLL, ctypes.CDLL]:
    lib = ctypes.CDLL("libumockdev.so.0")
    gobject = ctypes.CDLL("libgobject-2.0.so.0")
    ptr, text = ctypes.c_void_p, ctypes.c_char_p
    err = ctypes.POINTER(ctypes.POINTER(_GError))
    lib.umockdev_testbed_new.restype = ptr
    lib.umockdev_testbed_new.argtypes = []
    lib.umockdev_testbed_get_root_dir.restype = ptr  # a gchar* we must free
    lib.umockdev_testbed_get_root_dir.argtypes = [ptr]
    lib.umockdev_testbed_add_from_string.restype = ctypes.c_int
    lib.umockdev_testbed_add_from_string.argtypes = [ptr, text, err]
    lib.umockdev_testbed_uevent.restype = None
    lib.umockdev_testbed_uevent.argtypes = [ptr, text, text]
    lib.umockdev_testbed_set_attribute.restype = None
    lib.umockdev_testbed_set_attribute.argtypes = [ptr, text, text, text]
    lib.umockdev_testbed_remove_device.restype = None
    lib.umockdev_testbed_remove_device.argtypes = [ptr, text]
    gobject.g_object_unref.restype = None
    gobject.g_object_unref.argtypes = [ptr]
    glib = ctypes.CDLL("libglib-2.0.so.0")
    glib.g_free.argtypes = [ptr]
    glib.g_error_free.argtypes = [ctypes.POINTER(_GError)]
    return lib, gobject, glib


def _sys(path: str) -> str:
    """Accept ``/sys/devices/...`` or ``/devices/...``."""
    return path if path.startswith("/sys/") else "/sys" + path


class Testbed:
    """A fake device tree for libudev in this process. Use as a context manager;
    one at a time (umockdev points ``UMOCKDEV_DIR`` at the newest testbed)."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        if not under_preload():
            raise RuntimeError(
                f"umockdev needs {PRELOAD} preloaded: run under `umockdev-wrapper python3 ...`"
            )
        self._lib, self._gobject, self._glib = _load()
        self._handle: int | None = self._lib.umockdev_testbed_new()
        raw = self._lib.umockdev_testbed_get_root_dir(self._handle)
        self.root = Path(ctypes.string_at(raw).decode())
        self._glib.g_free(raw)

    def __enter__(self) -> Testbed:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Drop the testbed; umockdev deletes its directory and unsets UMOCKDEV_DIR."""
        if self._handle is not None:
            self._gobject.g_object_unref(self._handle)
            self._handle = None

    def add(self, description: str) -> None:
        """Add devices from umockdev text (``P:``/``E:``/``A:``/``L:``/``N:`` blocks);
        umockdev sends an ``add`` uevent for each. Lines starting with ``#`` are
        comments (umockdev itself has none): the trees say there where each fact
        comes from."""
        text = "\n".join(line for line in description.splitlines() if not line.startswith("#"))
        err = ctypes.POINTER(_GError)()
        ok = self._lib.umockdev_testbed_add_from_string(
            self._handle, text.lstrip("\n").encode() + b"\n", ctypes.byref(err)
        )
        if not ok:
            message = err.contents.message.decode() if err else "unknown error"
            if err:
                self._glib.g_error_free(err)
            raise ValueError(f"umockdev rejected the device description: {message}")

    def add_file(self, path: str | os.PathLike[str]) -> None:
        self.add(Path(path).read_text(encoding="utf-8"))

    def uevent(self, syspath: str, action: str) -> None:
        self._lib.umockdev_testbed_uevent(self._handle, _sys(syspath).encode(), action.encode())

    def set_attribute(self, syspath: str, name: str, value: str, event: bool = True) -> None:
        """Change a sysfs attribute and (by default) send the ``change`` uevent the
        kernel would."""
        self._lib.umockdev_testbed_set_attribute(
            self._handle, _sys(syspath).encode(), name.encode(), value.encode()
        )
        if event:
            self.uevent(syspath, "change")

    def unbind_driver(self, syspath: str) -> None:
        """What ``echo <dev> > driver/unbind`` does: the driver link goes, ``unbind`` is sent."""
        link = self.root / _sys(syspath).lstrip("/") / "driver"
        link.unlink(missing_ok=True)
        self.uevent(syspath, "unbind")

    def bind_driver(self, syspath: str, driver: str, bus: str = "pci") -> None:
        link = self.root / _sys(syspath).lstrip("/") / "driver"
        link.unlink(missing_ok=True)
        depth = _sys(syspath).strip("/").count("/")
        link.symlink_to("../" * depth + f"bus/{bus}/drivers/{driver}")
        self.uevent(syspath, "bind")

    def remove_node(self, devnode: str) -> None:
        """Delete a device node (``/dev/...``) without touching sysfs."""
        (self.root / devnode.lstrip("/")).unlink(missing_ok=True)

    def remove(self, syspath: str) -> None:
        """Hot-unplug a device and its children: ``remove`` uevents children first,
        as the kernel sends them, then the sysfs directories and /dev nodes go."""
        top = self.root / _sys(syspath).lstrip("/")
        doomed = sorted(
            (p.parent for p in top.rglob("uevent") if not p.parent.is_symlink()),
            key=lambda p: len(p.parts),
            reverse=True,
        )
        for path in doomed:
            rel = "/" + str(path.relative_to(self.root))
            devname = _devname(path / "uevent")
            self.uevent(rel, "remove")
            self._lib.umockdev_testbed_remove_device(self._handle, rel.encode())
            if devname:
                self.remove_node("/dev/" + devname)


def _devname(uevent: Path) -> str | None:
    try:
        lines = uevent.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("DEVNAME="):
            return line.split("=", 1)[1].removeprefix("/dev/")
    return None


# --------------------------------------------------------------------------- trees

# Bus numbers of the eight OAM GPUs of an 8x MI300X server (one per PCIe switch);
# guessed after published `lspci -tv` listings of such servers, not measured.
MI300X_BUSES = ("05", "26", "46", "65", "85", "a6", "c6", "e5")


def _block(path: str, lines: list[str]) -> str:
    return "\n".join([f"P: {path}", *lines]) + "\n"


def _switch(slot: int) -> tuple[str, str, str, int]:
    """(root port, switch upstream port, the GPU's downstream port, root bus) of GPU
    ``slot``: the GPU's bus is root + 3, the NIC's root + 4, the NVMe drive's root + 5
    (the switch's internal bus root + 2 holds one downstream port for each)."""
    root = int(MI300X_BUSES[slot], 16) - 3
    rp = f"/devices/pci0000:{root:02x}/0000:{root:02x}:01.1"
    up = f"{rp}/0000:{root + 1:02x}:00.0"
    return rp, up, f"{up}/0000:{root + 2:02x}:00.0", root


def mi300x_gpu(slot: int, card: int, render: int) -> tuple[str, str]:
    """(umockdev text, sysfs path) of GPU ``slot`` of :func:`mi300x_tree` with its DRM
    nodes card<card>/renderD<render>, its hwmon and its SMU i2c adapters: what
    amdgpu creates below the PCI function (the nodes as
    docs/sources.md#accelerator-sysfs says; hwmon and i2c children guessed after
    amdgpu's sysfs on Instinct cards)."""
    bus = MI300X_BUSES[slot]
    numa = 0 if slot < 4 else 1
    gpu = f"{_switch(slot)[2]}/0000:{bus}:00.0"
    depth = gpu.count("/")
    blocks = [
        _block(
            gpu,
            [
                "E: SUBSYSTEM=pci",
                "E: DRIVER=amdgpu",
                f"E: PCI_SLOT_NAME=0000:{bus}:00.0",
                "A: vendor=0x1002",
                "A: device=0x74a1",  # MI300X (guessed from pci.ids listings)
                "A: class=0x120000",  # processing accelerator (guessed likewise)
                f"A: numa_node={numa}",
                f"A: serial_number=0x{0x61D3A0 + slot:016x}",
                "L: driver=" + "../" * (depth - 1) + "bus/pci/drivers/amdgpu",
            ],
        ),
        _block(
            f"{gpu}/drm/card{card}",
            [f"N: dri/card{card}", "E: SUBSYSTEM=drm", f"E: DEVNAME=/dev/dri/card{card}"],
        ),
        _block(
            f"{gpu}/drm/renderD{render}",
            [
                f"N: dri/renderD{render}",
                "E: SUBSYSTEM=drm",
                f"E: DEVNAME=/dev/dri/renderD{render}",
            ],
        ),
        _block(f"{gpu}/hwmon/hwmon{render}", ["E: SUBSYSTEM=hwmon", "A: name=amdgpu"]),
    ]
    for i in range(2):
        blocks.append(_block(f"{gpu}/i2c-{render * 2 + i}", ["E: SUBSYSTEM=i2c"]))
    return "\n".join(blocks), "/sys" + gpu


def mi300x_tree(gpus: int = 8) -> str:
    """umockdev text of an 8x MI300X node: per GPU a root port, a PCIe switch
    (upstream and downstream ports) that also carries a NIC and an NVMe drive, then
    the GPU and its children; a BMC VGA on card0; /dev/kfd; a few chipset devices.

    Sourced: DRM children of the PCI function, card numbering after the BMC's
    card0, /dev/kfd a virtual device (docs/sources.md#accelerator-sysfs); GPUs, NICs and NVMe
    drives sharing PCIe switches (the usual 8-GPU server design). Guessed: every
    ID and bus number, the NIC and NVMe children, the counts of other devices."""
    blocks = [
        _block(
            "/devices/pci0000:00/0000:00:07.1/0000:02:00.0",
            [
                "E: SUBSYSTEM=pci",
                "E: DRIVER=ast",
                "A: vendor=0x1a03",
                "A: device=0x2000",
                "A: class=0x030000",
                "A: numa_node=0",
                "L: driver=../../../../bus/pci/drivers/ast",
            ],
        ),
        _block(
            "/devices/pci0000:00/0000:00:07.1/0000:02:00.0/drm/card0",
            ["N: dri/card0", "E: SUBSYSTEM=drm", "E: DEVNAME=/dev/dri/card0"],
        ),
        _block(
            "/devices/virtual/kfd/kfd",
            ["N: kfd", "E: SUBSYSTEM=kfd", "E: DEVNAME=/dev/kfd", "E: MAJOR=511", "E: MINOR=0"],
        ),
    ]
    for n in range(24):  # chipset functions: SMBus, USB, SATA ... (no nodes)
        blocks.append(
            _block(
                f"/devices/pci0000:00/0000:00:{n // 8 + 0x14:02x}.{n % 8}",
                ["E: SUBSYSTEM=pci", "A: vendor=0x1022", f"A: device=0x{0x790B + n:04x}"],
            )
        )
    for slot in range(gpus):
        rp, up, down, root = _switch(slot)
        numa = 0 if slot < 4 else 1
        for path, dev in ((rp, "0x14ab"), (up, "0xc030"), (down, "0xc030")):
            vendor = "0x1022" if dev == "0x14ab" else "0x1000"
            depth = path.count("/")
            blocks.append(
                _block(
                    path,
                    [
                        "E: SUBSYSTEM=pci",
                        "E: DRIVER=pcieport",
                        f"A: vendor={vendor}",
                        f"A: device={dev}",
                        "A: class=0x060400",
                        f"A: numa_node={numa}",
                        "L: driver=" + "../" * (depth - 1) + "bus/pci/drivers/pcieport",
                    ],
                )
            )
        nic = f"{up}/0000:{root + 2:02x}:01.0/0000:{root + 4:02x}:00.0"
        nvme = f"{up}/0000:{root + 2:02x}:02.0/0000:{root + 5:02x}:00.0"
        for port in (f"{up}/0000:{root + 2:02x}:01.0", f"{up}/0000:{root + 2:02x}:02.0"):
            blocks.append(
                _block(port, ["E: SUBSYSTEM=pci", "A: vendor=0x1000", "A: class=0x060400"])
            )
        blocks += [
            _block(
                nic,
                [
                    "E: SUBSYSTEM=pci",
                    "E: DRIVER=mlx5_core",
                    "A: vendor=0x15b3",
                    "A: device=0x1021",
                    "A: class=0x020700",
                    f"A: numa_node={numa}",
                ],
            ),
            _block(f"{nic}/net/ib{slot}", ["E: SUBSYSTEM=net", f"E: INTERFACE=ib{slot}"]),
            _block(
                f"{nic}/infiniband_verbs/uverbs{slot}",
                [
                    f"N: infiniband/uverbs{slot}",
                    "E: SUBSYSTEM=infiniband_verbs",
                    f"E: DEVNAME=/dev/infiniband/uverbs{slot}",
                ],
            ),
            _block(
                nvme,
                [
                    "E: SUBSYSTEM=pci",
                    "E: DRIVER=nvme",
                    "A: vendor=0x144d",
                    "A: device=0xa80a",
                    "A: class=0x010802",
                    f"A: numa_node={numa}",
                ],
            ),
            _block(
                f"{nvme}/nvme/nvme{slot}",
                [f"N: nvme{slot}", "E: SUBSYSTEM=nvme", f"E: DEVNAME=/dev/nvme{slot}"],
            ),
            _block(
                f"{nvme}/nvme/nvme{slot}/nvme{slot}n1",
                [
                    f"N: nvme{slot}n1",
                    "E: SUBSYSTEM=block",
                    "E: DEVTYPE=disk",
                    f"E: DEVNAME=/dev/nvme{slot}n1",
                ],
            ),
        ]
        blocks.append(mi300x_gpu(slot, card=slot + 1, render=128 + slot)[0])
    return "\n".join(blocks)


def mi300x_nvme(slot: int) -> str:
    """The sysfs path of the NVMe drive's block device on GPU ``slot``'s switch."""
    _, up, _, root = _switch(slot)
    nvme = f"{up}/0000:{root + 2:02x}:02.0/0000:{root + 5:02x}:00.0"
    return f"/sys{nvme}/nvme/nvme{slot}/nvme{slot}n1"


def mi300x_nic(slot: int) -> str:
    """The sysfs path of the NIC's PCI function on GPU ``slot``'s switch."""
    _, up, _, root = _switch(slot)
    return f"/sys{up}/0000:{root + 2:02x}:01.0/0000:{root + 4:02x}:00.0"


# Bus numbers of the eight cards of an 8x Gaudi2 server (HLS-2 style, two cards
# per PCIe switch); guessed, not measured.
GAUDI2_BUSES = ("19", "1a", "3b", "3c", "9a", "9b", "bb", "bc")


def _gaudi2_switch(pair: int) -> tuple[str, str, list[str], int]:
    """(root port, switch upstream port, its four downstream ports, base bus) of the
    switch of cards 2*pair and 2*pair+1: ports 0 and 1 lead to the cards, 2 to a
    NIC (bus base + 5), 3 to an NVMe drive (base + 6)."""
    base = int(GAUDI2_BUSES[2 * pair], 16) - 3
    rp = f"/devices/pci0000:{base:02x}/0000:{base:02x}:01.0"
    up = f"{rp}/0000:{base + 1:02x}:00.0"
    return rp, up, [f"{up}/0000:{base + 2:02x}:{p:02x}.0" for p in range(4)], base


def gaudi2_card(slot: int, index: int) -> tuple[str, str, str]:
    """(umockdev text, PCI sysfs path, control node sysfs path) of card ``slot`` of
    :func:`gaudi2_tree` with accel index ``index``: the PCI function with the
    habanalabs attributes, its accel<index> child and the parentless control node
    accel_controlD<index> (docs/sources.md#accelerator-sysfs; drivers/accel/habanalabs/
    common/device.c and sysfs.c). Module IDs are the slot numbers reversed, so they
    differ from accel indices (module_id is the firmware's card location)."""
    bus = GAUDI2_BUSES[slot]
    numa = 0 if slot < 4 else 1
    card = f"{_gaudi2_switch(slot // 2)[2][slot % 2]}/0000:{bus}:00.0"
    control = f"/devices/virtual/accel/accel_controlD{index}"
    blocks = [
        _block(
            card,
            [
                "E: SUBSYSTEM=pci",
                "E: DRIVER=habanalabs",
                f"E: PCI_SLOT_NAME=0000:{bus}:00.0",
                "A: vendor=0x1da3",
                "A: device=0x1020",
                "A: class=0x120000",
                f"A: numa_node={numa}",
                f"A: module_id={7 - slot}",
                "A: status=operational",
                "A: device_type=GAUDI2",
                "L: driver=" + "../" * (card.count("/") - 1) + "bus/pci/drivers/habanalabs",
            ],
        ),
        _block(
            f"{card}/accel/accel{index}",
            [
                f"N: accel/accel{index}",
                "E: SUBSYSTEM=accel",
                "E: DEVTYPE=accel_minor",
                f"E: DEVNAME=/dev/accel/accel{index}",
                "E: MAJOR=261",
                f"E: MINOR={index}",
            ],
        ),
        _block(
            control,
            [
                f"N: accel/accel_controlD{index}",
                "E: SUBSYSTEM=accel",
                f"E: DEVNAME=/dev/accel/accel_controlD{index}",
                "E: MAJOR=510",
                f"E: MINOR={index}",
            ],
        ),
    ]
    return "\n".join(blocks), "/sys" + card, "/sys" + control


def gaudi2_tree(cards: int = 8) -> str:
    """umockdev text of an 8x Gaudi2 node: two cards per PCIe switch, each switch
    with a NIC and an NVMe drive too, a BMC VGA, chipset devices. Sourced and
    guessed facts as :func:`gaudi2_card` and :func:`mi300x_tree` say."""
    blocks = []
    for n in range(24):
        blocks.append(
            _block(
                f"/devices/pci0000:00/0000:00:{n // 8 + 0x14:02x}.{n % 8}",
                ["E: SUBSYSTEM=pci", "A: vendor=0x8086", f"A: device=0x{0x1BC0 + n:04x}"],
            )
        )
    for slot in range(0, cards, 2):
        rp, up, ports, base = _gaudi2_switch(slot // 2)
        for path in (rp, up, *ports):
            blocks.append(
                _block(path, ["E: SUBSYSTEM=pci", "E: DRIVER=pcieport", "A: class=0x060400"])
            )
        nic = f"{ports[2]}/0000:{base + 5:02x}:00.0"
        nvme = f"{ports[3]}/0000:{base + 6:02x}:00.0"
        blocks += [
            _block(nic, ["E: SUBSYSTEM=pci", "A: vendor=0x15b3", "A: class=0x020000"]),
            _block(f"{nic}/net/eth{slot}", ["E: SUBSYSTEM=net"]),
            _block(nvme, ["E: SUBSYSTEM=pci", "A: vendor=0x144d", "A: class=0x010802"]),
            _block(
                f"{nvme}/nvme/nvme{slot}",
                [f"N: nvme{slot}", "E: SUBSYSTEM=nvme", f"E: DEVNAME=/dev/nvme{slot}"],
            ),
        ]
    for slot in range(cards):
        blocks.append(gaudi2_card(slot, index=slot)[0])
    return "\n".join(blocks)
