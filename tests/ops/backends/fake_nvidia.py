"""A tiny stand-in for a GPU backend's driver checks, read from a (fake) root.

It does what an operator does by hand: load ``libnvidia-ml.so.1`` (a real
``dlopen``; on a node without the driver it fails as it would there) and
compare the kernel module's version (``/proc/driver/nvidia/version``) with the
user-space library's (``libnvidia-ml.so.<version>``). Options: ``root``,
``library`` (what to dlopen), ``libDir``.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

from hetero_dp import Check, Device, hookimpl

_options: dict = {}


def _root(options) -> Path:
    return Path(options.get("root", "/"))


def _kernel_version(root: Path) -> str | None:
    try:
        text = (root / "proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def _library_version(root: Path, lib_dir: str) -> str | None:
    for p in sorted((root / lib_dir.lstrip("/")).glob("libnvidia-ml.so.*.*")):
        return p.name.removeprefix("libnvidia-ml.so.")
    return None


@hookimpl
def doctor(options) -> list[Check]:
    root = _root(options)
    try:
        ctypes.CDLL(options.get("library", "libnvidia-ml.so.1"))
    except OSError as e:
        return [
            Check(
                "nvml",
                "fail",
                f"libnvidia-ml.so.1 does not load ({e}): the NVIDIA driver is not installed "
                "or not visible in this container",
                "install the NVIDIA driver on the host, or run the plugin with the "
                "nvidia runtime so the library is mounted in",
            )
        ]
    kernel = _kernel_version(root)
    library = _library_version(root, options.get("libDir", "/usr/lib/x86_64-linux-gnu"))
    if kernel and library and kernel != library:
        return [
            Check(
                "driver version",
                "fail",
                f"Driver/library version mismatch: kernel module {kernel}, libnvidia-ml {library}",
                "reload the module or reboot (the driver was upgraded without unloading "
                "the old kernel module)",
            )
        ]
    return [Check("nvml", "pass", f"driver {kernel or 'unknown'} loads")]


@hookimpl
def configure(options) -> None:
    _options.clear()
    _options.update(options)


@hookimpl
def discover() -> list[Device]:
    count = int(_options.get("count", 0))
    return [Device(id=f"GPU-{i}", resource="nvidia.com/gpu", index=i) for i in range(count)]


@hookimpl
def runtime_advice(runtime, needs_cdi, root):
    # the NVIDIA backend's own advice: what its GPUs need from the runtime
    from hetero_dp_nvidia.runtime_advice import advice

    return advice(runtime, needs_cdi, root)
