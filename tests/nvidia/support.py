"""Helpers for the NVIDIA tests: build the fake NVML, write scenarios and fake host trees."""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

FAKE_DIR = Path(__file__).resolve().parents[1] / "fakenvml"
SCENARIOS = FAKE_DIR / "scenarios"


def build_fake(out_dir: Path, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile the fake NVML into out_dir/libnvidia-ml.so.1."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fake libnvidia-ml.so.1")
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / "libnvidia-ml.so.1"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-pthread",
            "-Wall",
            "-Wno-format-truncation",
            "-Wl,-soname,libnvidia-ml.so.1",
            *extra_flags,
            "-o",
            str(lib),
            str(FAKE_DIR / "fake_nvml.c"),
        ],
        check=True,
    )
    return lib


@dataclass
class FakeNode:
    """A scenario plus the fake host trees the backend reads (sysfs, /dev, /proc)."""

    lib: ctypes.CDLL
    root: Path
    scenario: Path
    gpus: list[dict[str, str]] = field(default_factory=list)
    migs: list[dict[str, str]] = field(default_factory=list)

    @property
    def options(self) -> dict[str, object]:
        return {
            "nvidiaDriverRoot": str(self.root / "driver"),
            "sysfsRoot": str(self.root / "sys"),
            "procRoot": str(self.root / "proc"),
        }

    def uuid(self, index: int) -> str:
        return self.gpus[index]["uuid"]

    def mig_uuids(self, gpu: int) -> list[str]:
        return [m["uuid"] for m in self.migs if int(m["gpu"]) == gpu]


def parse_scenario(text: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    gpus, migs = [], []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        kind, *rest = shlex.split(line)
        fields = dict(item.split("=", 1) for item in rest if "=" in item)
        if kind == "gpu":
            gpus.append(fields)
        elif kind == "mig":
            migs.append(fields)
    return gpus, migs


def make_node(
    lib: ctypes.CDLL,
    root: Path,
    base: str,
    extra: tuple[str, ...] = (),
    control_nodes: tuple[str, ...] = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"),
) -> FakeNode:
    text = (SCENARIOS / base).read_text() if base else ""
    text += "".join(line + "\n" for line in extra)
    scenario = root / "scenario.scn"
    root.mkdir(parents=True, exist_ok=True)
    scenario.write_text(text)
    gpus, migs = parse_scenario(text)
    dev = root / "driver" / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    # Each node a link to /dev/null: a character device, as the driver's are (the
    # container gate refuses a regular file as a device node).
    for name in control_nodes:
        _fake_node(dev / name)
    for g in gpus:
        _fake_node(dev / f"nvidia{g.get('minor', '0')}")
        bus = g["pci"].lower()[4:]
        pci = root / "sys/bus/pci/devices" / bus
        pci.mkdir(parents=True, exist_ok=True)
        (pci / "numa_node").write_text(g.get("numa", "-1") + "\n")
    for g in gpus:
        if g.get("allcaps") == "1":
            _write_all_caps(root, g.get("minor", "0"))
    for m in migs:
        minor = gpus[int(m["gpu"])].get("minor", m["gpu"])
        gi_dir = root / f"proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{m['gi']}"
        ci_dir = gi_dir / f"ci{m['ci']}"
        ci_dir.mkdir(parents=True, exist_ok=True)
        (gi_dir / "access").write_text(f"DeviceFileMinor: {m['gicap']}\nDeviceFileMode: 292\n")
        (ci_dir / "access").write_text(f"DeviceFileMinor: {m['cicap']}\nDeviceFileMode: 292\n")
    return FakeNode(lib, root, scenario, gpus, migs)


def _fake_node(path: Path) -> None:
    if not path.is_symlink():
        os.symlink("/dev/null", path)


def _write_all_caps(root: Path, minor: str) -> None:
    """Every GPU/compute instance capability file of a GPU, with the minors of
    /proc/driver/nvidia-caps/mig-minors (NVIDIA MIG user guide: after ``config 1`` and
    ``monitor 2``, each GPU has 15 GPU instance IDs of 9 minors each, the instance's
    own then its 8 compute instances': gpu0/gi0/access 3, gpu0/gi0/ci0/access 4 ...)."""
    base = 3 + 135 * int(minor)
    for gi in range(15):
        gi_dir = root / f"proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}"
        gi_dir.mkdir(parents=True, exist_ok=True)
        (gi_dir / "access").write_text(f"DeviceFileMinor: {base + 9 * gi}\nDeviceFileMode: 292\n")
        for ci in range(8):
            ci_dir = gi_dir / f"ci{ci}"
            ci_dir.mkdir(exist_ok=True)
            (ci_dir / "access").write_text(
                f"DeviceFileMinor: {base + 9 * gi + 1 + ci}\nDeviceFileMode: 292\n"
            )


class Watching:
    """A backend's watch hook running in a thread, reporting into a real EventSink."""

    def __init__(self, backend: object) -> None:
        import asyncio

        from hetero_dp import EventSink

        self.backend = backend
        self.health: asyncio.Queue[tuple[str, bool, str]] = asyncio.Queue()
        self.rediscovered = 0
        self.sink = EventSink(
            asyncio.get_running_loop(),
            lambda i, h, r: self.health.put_nowait((i, h, r)),
            self._rediscover,
        )
        self._task: asyncio.Future[None] | None = None

    def _rediscover(self) -> None:
        self.rediscovered += 1

    async def __aenter__(self) -> Watching:
        import asyncio

        self._task = asyncio.ensure_future(asyncio.to_thread(self.backend.watch, self.sink))
        ready = await asyncio.to_thread(self.backend.monitor.ready.wait, 10)
        assert ready, "the watch hook never registered its events"
        return self

    async def next_health(self, timeout: float = 5.0) -> tuple[str, bool, str]:
        import asyncio

        return await asyncio.wait_for(self.health.get(), timeout)

    async def __aexit__(self, *exc: object) -> None:
        import asyncio

        self.sink.stopping.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, 10)


FAKE_MPS_CONTROL = Path(__file__).resolve().parent / "fake_mps_control.py"


def install_fake_mps_control(driver_root: Path) -> Path:
    """Put the fake ``nvidia-cuda-mps-control`` where the driver keeps it (``usr/bin``)."""
    import sys

    path = driver_root / "usr" / "bin" / "nvidia-cuda-mps-control"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {FAKE_MPS_CONTROL} "$@"\n')
    path.chmod(0o755)
    return path


def kill_fake_mps_daemons(root: Path) -> None:
    """End every fake control daemon still running under an MPS root (test teardown)."""
    import os
    import signal

    for pidfile in root.glob("**/fake-mps.pid"):
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
