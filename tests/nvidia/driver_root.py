"""A fake NVIDIA driver installation under a driver root, for the CDI spec tests.

Facts it encodes, with their sources:
- File names and places: what NVIDIA's driver installer (``.run`` / Debian
  packages) puts on an x86-64 Debian/Ubuntu host and what NVIDIA's CDI spec
  mounts (docs/sources.md#nvidia-cdi-spec: nvidia-container-toolkit's pkg/nvcdi):
  ``/usr/lib/x86_64-linux-gnu/
  <lib>.so.<driver version>`` with a soname symlink (``libcuda.so.1`` ->
  ``libcuda.so.550.54.15``), utilities in ``/usr/bin``, the persistenced socket
  ``/run/nvidia-persistenced/socket``, GSP firmware
  ``/lib/firmware/nvidia/<version>/gsp_*.bin``.
- Sonames: ``.so.1`` for every library here except ``libnvidia-nvvm.so.4``
  (``objdump -p`` of driver 550 libraries). Guessed, not checked against a real
  550 install: ``libnvidia-gpucomp`` and ``libnvidia-pkcs11-openssl3`` use
  ``.so.<version>`` as soname, so they get no extra link.
- The libraries are real ELF shared objects (empty, linked by gcc with the
  soname), because the ld cache is built by the real ``ldconfig``, which reads
  each file's soname.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

VERSION = "550.54.15"  # tests/fakenvml/scenarios/*.scn: "driver 550.54.15"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
SONAMES = {
    "libcuda": "libcuda.so.1",
    "libcudadebugger": "libcudadebugger.so.1",
    "libnvidia-ml": "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm": "libnvidia-nvvm.so.4",
    "libnvcuvid": "libnvcuvid.so.1",
    "libnvidia-encode": "libnvidia-encode.so.1",
    "libnvidia-opticalflow": "libnvidia-opticalflow.so.1",
    "libnvidia-allocator": "libnvidia-allocator.so.1",
    "libnvidia-cfg": "libnvidia-cfg.so.1",
    "libnvidia-gpucomp": f"libnvidia-gpucomp.so.{VERSION}",
    "libnvidia-opencl": "libnvidia-opencl.so.1",
    "libnvidia-pkcs11-openssl3": f"libnvidia-pkcs11-openssl3.so.{VERSION}",
}
UTILITIES = ("nvidia-smi", "nvidia-persistenced", "nvidia-cuda-mps-control")  # no debugdump
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


def _elf(out: Path, soname: str, work: Path) -> None:
    obj = work / "empty.o"
    if not obj.exists():
        src = work / "empty.c"
        src.write_text("int hetero_dp_fake_driver_symbol;\n")
        subprocess.run(["gcc", "-c", "-fPIC", "-o", str(obj), str(src)], check=True)
    subprocess.run(
        ["gcc", "-shared", f"-Wl,-soname,{soname}", "-o", str(out), str(obj)], check=True
    )


def make_driver_root(
    root: Path, *, lib_dir: str = LIB_DIR, libs: tuple[str, ...] = tuple(SONAMES)
) -> Path:
    """Install the fake driver files under ``root``; returns ``root``."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build stand-in driver libraries")
    work = root.parent / f".{root.name}-build"
    work.mkdir(parents=True, exist_ok=True)
    libs_at = root / lib_dir.lstrip("/")
    libs_at.mkdir(parents=True, exist_ok=True)
    for stem in libs:
        real = f"{stem}.so.{VERSION}"
        _elf(libs_at / real, SONAMES[stem], work)
        if SONAMES[stem] != real:
            os.symlink(real, libs_at / SONAMES[stem])
    # An older driver's leftover: a different version must never be mounted.
    _elf(libs_at / "libcuda.so.535.104.05", "libcuda.so.1", work)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/ld.so.conf").write_text(f"{lib_dir}\n")
    for name in UTILITIES:
        path = root / "usr/bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    fw = root / "lib/firmware/nvidia" / VERSION
    fw.mkdir(parents=True)
    for name in FIRMWARE:
        (fw / name).write_bytes(b"\0")
    return root


def add_persistenced_socket(root: Path) -> socket.socket:
    """A listening unix socket where nvidia-persistenced puts its own (caller closes it)."""
    path = root / "run/nvidia-persistenced/socket"
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen(1)
    return s


def build_ld_cache(root: Path) -> None:
    """``/etc/ld.so.cache`` under ``root``, built by the real ldconfig.

    ``ldconfig -r`` chroots: as root directly, otherwise inside a user namespace
    (``unshare -r``) where the kernel allows one; skipped when neither works.
    """
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")
    if ldconfig is None:
        pytest.skip("ldconfig is needed to build an ld cache")
    # -X: leave the soname links as they are (the installer made them)
    command = [ldconfig, "-X", "-r", str(root)]
    if os.geteuid() != 0:
        unshare = shutil.which("unshare")
        if unshare is None:
            pytest.skip("building an ld cache under a root needs root or unshare -r")
        command = [unshare, "-r", *command]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0 and os.geteuid() != 0:  # no user namespaces here
        pytest.skip(f"ldconfig -r failed without root ({out.stderr.strip()})")
    assert out.returncode == 0, out.stderr
