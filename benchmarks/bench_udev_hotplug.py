"""Hotplug latency of the udev backend: uevent to kubelet-visible ListAndWatch update.

A umockdev testbed adds (and then removes) an AMD GPU with its DRM nodes; the
clock runs from the moment the testbed has sent the uevents until a FakeKubelet,
connected to the real daemon over unix sockets, holds a device list with (or
without) the GPU. Then a driver unbind/bind turns another GPU Unhealthy and
Healthy again. Median and p99 over many events. Goal: median under 20 ms
(squat's generic-device-plugin rescans /dev every 5 s: 2.5 s on average).

umockdev's preload library must be loaded at process start, so ``run()`` re-runs
this file under ``umockdev-wrapper`` when it is not already; without umockdev it
returns ``{"skipped": reason}``.

Run: ``python benchmarks/bench_udev_hotplug.py`` (needs umockdev: ``apt-get install
umockdev libumockdev0``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "vendors" / "udev"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from benchmarks import median, percentile  # noqa: E402

EVENTS = 200
RESOURCE = "amd.com/gpu"
DATA = ROOT / "tests" / "udev" / "data" / "amd-gpu.umockdev"
GPU_PATH = "/sys/devices/pci0000:80/0000:80:01.1/0000:83:00.0"
GPU_ID = "0000:83:00.0"
BOUND_PATH = "/sys/devices/pci0000:40/0000:40:01.1/0000:43:00.0"
BOUND_ID = "0000:43:00.0"
NEW_GPU = """P: /devices/pci0000:80/0000:80:01.1/0000:83:00.0
E: SUBSYSTEM=pci
E: DRIVER=amdgpu
A: vendor=0x1002
A: device=0x740f
A: class=0x038000
A: numa_node=1
L: driver=../../../../bus/pci/drivers/amdgpu

P: /devices/pci0000:80/0000:80:01.1/0000:83:00.0/drm/card{card}
N: dri/card{card}
E: SUBSYSTEM=drm
E: DEVNAME=/dev/dri/card{card}

P: /devices/pci0000:80/0000:80:01.1/0000:83:00.0/drm/renderD{render}
N: dri/renderD{render}
E: SUBSYSTEM=drm
E: DEVNAME=/dev/dri/renderD{render}
"""
BRIDGE = """P: /devices/pci0000:80/0000:80:01.1
E: SUBSYSTEM=pci
E: DRIVER=pcieport
A: vendor=0x1022
A: device=0x1483
A: numa_node=1
L: driver=../../../bus/pci/drivers/pcieport
"""


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(median(values) * 1000, 3),
        "p99_ms": round(percentile(values, 99.0) * 1000, 3),
        "max_ms": round(max(values) * 1000, 3),
    }


async def _measure(events: int) -> dict[str, Any]:
    from hetero_dp_udev import UdevBackend
    from hetero_dp_udev.testing import Testbed

    from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir

    root = short_tempdir("hdp-bench-")
    add: list[float] = []  # from the last uevent sent to kubelet-visible
    remove: list[float] = []
    add_total: list[float] = []  # the same, plus umockdev building the sysfs tree
    remove_total: list[float] = []
    unbind: list[float] = []  # driver unbound -> device Unhealthy at the kubelet
    bind: list[float] = []  # bound again -> Healthy
    try:
        with Testbed() as bed:
            bed.add_file(DATA)
            bed.add(BRIDGE)
            async with FakeKubelet(root / "dp") as kubelet:
                runner = PluginRunner(kubelet.plugin_dir)
                try:
                    await runner.start(UdevBackend(), options={"udev": {"rules": ["amd-gpu"]}})
                    await kubelet.wait_devices(RESOURCE, lambda d: len(d) == 2)
                    for n in range(events):
                        # umockdev 0.17 aborts when a /dev node name comes back after
                        # a removal, so each plug gets fresh DRM minors
                        text = NEW_GPU.format(card=10 + n, render=1000 + n)
                        # The testbed runs on this thread, so the backend cannot see
                        # any uevent before the call returns: the clock that counts
                        # starts then; the total also counts umockdev's own work.
                        begin = time.perf_counter()
                        bed.add(text)
                        sent = time.perf_counter()
                        await kubelet.wait_devices(
                            RESOURCE,
                            lambda d: GPU_ID in d and d[GPU_ID].health == "Healthy",
                        )
                        done = time.perf_counter()
                        add.append(done - sent)
                        add_total.append(done - begin)
                        begin = time.perf_counter()
                        bed.remove(GPU_PATH)
                        sent = time.perf_counter()
                        await kubelet.wait_devices(RESOURCE, lambda d: GPU_ID not in d)
                        done = time.perf_counter()
                        remove.append(done - sent)
                        remove_total.append(done - begin)
                    for _ in range(events // 2):
                        sent = time.perf_counter()
                        bed.unbind_driver(BOUND_PATH)
                        await kubelet.wait_devices(
                            RESOURCE, lambda d: d[BOUND_ID].health == "Unhealthy"
                        )
                        unbind.append(time.perf_counter() - sent)
                        sent = time.perf_counter()
                        bed.bind_driver(BOUND_PATH, "amdgpu")
                        await kubelet.wait_devices(
                            RESOURCE, lambda d: d[BOUND_ID].health == "Healthy"
                        )
                        bind.append(time.perf_counter() - sent)
                finally:
                    await runner.stop_all()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "benchmark": "udev hotplug: uevent -> kubelet-visible ListAndWatch update",
        "events": len(add) + len(remove),
        "add": _ms(add),
        "remove": _ms(remove),
        "all": _ms(add + remove),
        "unbind_to_unhealthy": _ms(unbind),
        "bind_to_healthy": _ms(bind),
        "add_including_testbed": _ms(add_total),
        "remove_including_testbed": _ms(remove_total),
        "goal_median_ms": 20.0,
        "baseline": "squat generic-device-plugin rescans every 5 s (mean wait 2500 ms)",
    }


def run(events: int = EVENTS) -> dict[str, Any]:
    """Measure (re-running under umockdev-wrapper when needed); returns the numbers."""
    from hetero_dp_udev import testing

    if (why := testing.missing()) is not None:
        return {"skipped": why}
    if testing.under_preload():
        return asyncio.run(_measure(events))
    proc = subprocess.run(
        ["umockdev-wrapper", sys.executable, __file__, "--json", str(events)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark under umockdev-wrapper failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    count = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "--json" else EVENTS
    outcome = run(count)
    print(json.dumps(outcome) if "--json" in sys.argv else json.dumps(outcome, indent=2))
