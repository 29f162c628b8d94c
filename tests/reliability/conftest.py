"""Helpers for the reliability tests: process vitals and backends that misbehave."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hetero_dp import AllocationError, ContainerResponse, Device, DeviceNode, EventSink, hookimpl

SIM = "hetero-dp.io/sim"


@dataclass(frozen=True)
class Vitals:
    fds: int
    threads: int
    rss_mib: float


def vitals(pid: int | str = "self") -> Vitals:
    """Open file descriptors, OS threads and resident memory of a process, from /proc."""
    gc.collect()
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return Vitals(
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(fields["Threads"]),
        rss_mib=int(fields["VmRSS"].split()[0]) / 1024,
    )


def simulated() -> Any:
    """A fresh simulated backend (the entry point's object is one per process)."""
    from hetero_dp_simulated import SimulatedBackend

    return SimulatedBackend()


def devices(resource: str, count: int, prefix: str = "dev") -> list[Device]:
    return [
        Device(
            id=f"{prefix}{i}",
            resource=resource,
            index=i,
            nodes=(DeviceNode(f"/dev/{prefix}{i}"),),
            env={"VISIBLE": str(i)},
        )
        for i in range(count)
    ]


class Faulty:
    """A backend whose hooks fail on demand: ``mode[hook]`` is one of
    ``"raise"``, ``"hang"`` (blocks until :meth:`release`) or ``"garbage"``."""

    hetero_dp_name = "faulty"

    def __init__(self, resource: str = "example.com/faulty", count: int = 2) -> None:
        self.devices = devices(resource, count)
        self.mode: dict[str, str] = {}
        self.watch_failures = 0  # how many times watch raises before it runs normally
        self.watch_calls = 0
        self.watch_running = threading.Event()
        self._release = threading.Event()
        self.hang_ids: set[str] = set()  # check_health hangs for these devices only
        self.health_calls: dict[str, int] = {}

    def release(self) -> None:
        self._release.set()

    def _misbehave(self, hook: str, garbage: Any) -> Any:
        mode = self.mode.get(hook)
        if mode == "raise":
            raise RuntimeError(f"{hook} exploded")
        if mode == "hang":
            self._release.wait(30)
            return garbage
        if mode == "garbage":
            return garbage
        return None

    @hookimpl
    def discover(self) -> Any:
        if hook_mode := self.mode.get("discover"):
            return self._misbehave("discover", [object(), 42] if hook_mode != "hang" else [])
        return list(self.devices)

    @hookimpl
    def check_health(self, device: Device) -> Any:
        self.health_calls[device.id] = self.health_calls.get(device.id, 0) + 1
        if device.id in self.hang_ids:
            self._release.wait(30)  # a driver call that does not return (until released)
            return True
        if self.mode.get("check_health"):
            return self._misbehave("check_health", {"not": "a verdict"})
        return True

    @hookimpl
    def allocate(self, devices: list[Device], response: ContainerResponse) -> None:
        if self.mode.get("allocate") == "garbage":
            response.envs = {"BAD": object()}  # type: ignore[dict-item]
            response.devices.append("not a DeviceNode")  # type: ignore[arg-type]
            return
        if self.mode.get("allocate") == "refuse":
            raise AllocationError("npu0 has no free queue", code="FAILED_PRECONDITION")
        if self.mode.get("allocate") == "refuse-default":
            raise AllocationError("npu0 has no free queue")
        if self.mode.get("allocate"):
            self._misbehave("allocate", None)

    @hookimpl
    def watch(self, events: EventSink) -> None:
        self.watch_calls += 1
        if self.watch_calls <= self.watch_failures:
            raise RuntimeError("watcher lost the device event queue")
        self.watch_running.set()
        events.wait()


@pytest.fixture
def faulty() -> Any:
    backend = Faulty()
    yield backend
    backend.release()  # let hung hook threads finish


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def daemon_env(cli_env):
    """Environment for ``python -m hetero_dp run simulated`` from this checkout."""
    paths = [str(ROOT), str(ROOT / "vendors" / "simulated"), cli_env.get("PYTHONPATH", "")]
    cli_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return cli_env


async def spawn_simulated(
    kubelet_dir: Path, env: dict[str, str], log: Path, count: int = 3
) -> asyncio.subprocess.Process:
    """``hetero-dp run simulated`` as its own process, stderr appended to ``log``."""
    with open(log, "ab") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "hetero_dp",
            "run",
            "simulated",
            "--kubelet-dir",
            str(kubelet_dir),
            "-o",
            f"simulated.count={count}",
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stderr=err,
        )
