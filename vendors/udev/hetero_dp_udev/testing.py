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
