"""Hotplug of the udev backend on a realistic 8-GPU node: uevent to kubelet update.

The tree is :func:`hetero_dp_udev.testing.mi300x_tree`: eight AMD MI300X GPUs, each
behind its own PCIe switch shared with a NIC and an NVMe drive, a BMC VGA on
card0, /dev/kfd and chipset devices (what is sourced and what is guessed is said
there). The real daemon serves a FakeKubelet over unix sockets with the shipped
``amd-gpu`` rule set. Measured:

- one full scan of the tree (what every event cost before discovery became
  incremental; it is still what start-up and the framework's interval pay);
- a GPU unplugged (its function and children removed, remove uevents children
  first) and plugged again: from the moment the testbed has sent the uevents
  until the FakeKubelet holds the new device list; median and p99;
- a driver unbind and bind: until the kubelet sees Unhealthy, then Healthy;
- the plugin's CPU for 100 unrelated uevents: NVMe block-device changes (another
  subsystem, dropped by the kernel-side filter) and changes on a NIC's PCI
  function (a subsystem the rules listen to, so they reach the plugin and are
  found to concern no device). CPU is this process's CPU time (every thread)
  around the events plus a sentinel unbind/bind round the kubelet sees, minus the
  sentinel round alone and minus umockdev's own cost of sending the events to a
  monitor socket that filters out everything (under umockdev sendmsg and the
  socket filter run in this process; on a real host in the kernel); the median of
  several repetitions.

Goals (issue 15): add and remove median <= 10 ms, p99 <= 20 ms; 100 unrelated
events < 20 ms of plugin CPU in all.

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

PLUGS = 100  # each: one unplug and one plug
FLIPS = 50  # each: one unbind and one bind
UNRELATED = 100
REPEATS = 15
RESOURCE = "amd.com/gpu"
TREE = "8x AMD MI300X, each behind a PCIe switch with a NIC and an NVMe drive (~190 devices)"


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(median(values) * 1000, 3),
        "p99_ms": round(percentile(values, 99.0) * 1000, 3),
        "n": len(values),
    }


async def _measure() -> dict[str, Any]:
    from hetero_dp_udev import UdevBackend
    from hetero_dp_udev.testing import Testbed, mi300x_gpu, mi300x_nic, mi300x_nvme, mi300x_tree

    from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir

    root = short_tempdir("hdp-bench-")
    plug_slot, flip_slot = 7, 0
    _, plug_path = mi300x_gpu(plug_slot, 0, 0)
    plug_id = plug_path.rsplit("/", 1)[1]
    _, flip_path = mi300x_gpu(flip_slot, 0, 0)
    flip_id = flip_path.rsplit("/", 1)[1]
    add: list[float] = []
    remove: list[float] = []
    unbind: list[float] = []
    bind: list[float] = []
    scans: list[float] = []
    cpu: dict[str, list[float]] = {"filtered": [], "listened": []}
    try:
        with Testbed() as bed:
            bed.add(mi300x_tree())
            probe = UdevBackend()
            probe.configure({"rules": ["amd-gpu"]})
            for _ in range(20):
                begin = time.perf_counter()
                devices = probe.discover()
                scans.append(time.perf_counter() - begin)
            assert len(devices) == 8, devices

            async def send(kind: str) -> None:
                for n in range(UNRELATED):
                    if kind == "filtered":
                        bed.uevent(mi300x_nvme(n % 8), "change")
                    else:
                        bed.uevent(mi300x_nic(n % 8), "change")
                    if n % 5 == 4:
                        # umockdev's unix socket queues 10 datagrams (max_dgram_qlen); the plugin
                        # reads on this loop, so let it run (a real kernel would
                        # drop them with ENOBUFS instead of failing the sender)
                        await asyncio.sleep(0)

            # umockdev's own cost of sending, to one listening socket as in the real
            # run (sendmsg and the socket filter run in this process under umockdev,
            # in the kernel on a real host), whose filter drops everything
            import pyudev

            sink = pyudev.Monitor.from_netlink(pyudev.Context())
            sink.filter_by("hetero-dp-bench-none")
            sink.start()
            floors: dict[str, float] = {}
            for kind in cpu:
                begin = time.process_time()
                for _ in range(REPEATS):
                    await send(kind)
                floors[kind] = (time.process_time() - begin) / REPEATS
            del sink

            async with FakeKubelet(root / "dp") as kubelet:
                runner = PluginRunner(kubelet.plugin_dir)
                try:
                    await runner.start(UdevBackend(), options={"udev": {"rules": ["amd-gpu"]}})
                    await kubelet.wait_devices(RESOURCE, lambda d: len(d) == 8)

                    async def sentinel() -> None:
                        bed.unbind_driver(flip_path)
                        await kubelet.wait_devices(
                            RESOURCE, lambda d: d[flip_id].health == "Unhealthy"
                        )
                        bed.bind_driver(flip_path, "amdgpu")
                        await kubelet.wait_devices(
                            RESOURCE, lambda d: d[flip_id].health == "Healthy"
                        )

                    for n in range(PLUGS):
                        begin = time.perf_counter()
                        bed.remove(plug_path)
                        sent = time.perf_counter()
                        await kubelet.wait_devices(RESOURCE, lambda d: plug_id not in d)
                        remove.append(time.perf_counter() - sent)
                        # umockdev 0.17 aborts when a /dev node name comes back after
                        # a removal, so each plug gets fresh DRM minors
                        text, _ = mi300x_gpu(plug_slot, card=100 + n, render=1000 + n)
                        bed.add(text)
                        sent = time.perf_counter()
                        await kubelet.wait_devices(
                            RESOURCE,
                            lambda d: plug_id in d and d[plug_id].health == "Healthy",
                        )
                        add.append(time.perf_counter() - sent)
                    for _ in range(FLIPS):
                        sent = time.perf_counter()
                        bed.unbind_driver(flip_path)
                        await kubelet.wait_devices(
                            RESOURCE, lambda d: d[flip_id].health == "Unhealthy"
                        )
                        unbind.append(time.perf_counter() - sent)
                        sent = time.perf_counter()
                        bed.bind_driver(flip_path, "amdgpu")
                        await kubelet.wait_devices(
                            RESOURCE, lambda d: d[flip_id].health == "Healthy"
                        )
                        bind.append(time.perf_counter() - sent)
                    for _ in range(REPEATS):
                        for kind in cpu:
                            begin = time.process_time()
                            await sentinel()
                            alone = time.process_time() - begin
                            begin = time.process_time()
                            await send(kind)
                            await sentinel()
                            total = time.process_time() - begin
                            cpu[kind].append(total - alone - floors[kind])
                finally:
                    await runner.stop_all()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    add_ms, remove_ms = _ms(add), _ms(remove)
    filtered = round(median(cpu["filtered"]) * 1000, 2)
    listened = round(median(cpu["listened"]) * 1000, 2)
    return {
        "title": "udev backend: hotplug on an 8-GPU node",
        "rows": [
            _row("Full scan of the tree (start-up, interval; was: every event)", scans, ""),
            _row("GPU plugged to kubelet update, median", add, "<= 10 ms", "median"),
            _row("GPU plugged to kubelet update, p99", add, "<= 20 ms", "p99"),
            _row("GPU unplugged to kubelet update, median", remove, "<= 10 ms", "median"),
            _row("GPU unplugged to kubelet update, p99", remove, "<= 20 ms", "p99"),
            _row("Driver unbind to Unhealthy at the kubelet, median", unbind, ""),
            _row("Driver bind to Healthy at the kubelet, median", bind, ""),
            {
                "name": f"Plugin CPU for {UNRELATED} NVMe block events (kernel-filtered)",
                "value": filtered,
                "unit": "ms",
                "goal": "< 20 ms",
                "ok": filtered < 20,
            },
            {
                "name": f"Plugin CPU for {UNRELATED} change events on a NIC (pci, listened to)",
                "value": listened,
                "unit": "ms",
                "goal": "< 20 ms",
                "ok": listened < 20,
            },
        ],
        "notes": [
            f"Tree: {TREE}; rule set amd-gpu; the daemon in this process (PluginRunner) "
            "serving a FakeKubelet over unix sockets.",
            f"Plug/unplug: GPU slot {plug_slot} with its drm, hwmon and i2c children, "
            f"{PLUGS} times each; clock from the testbed having sent the uevents to the "
            f"kubelet's device list. p99 of {PLUGS} samples is their second-largest. "
            f"add {add_ms}, remove {remove_ms}.",
            "CPU: process CPU time around the events plus a sentinel unbind/bind round, "
            "minus the sentinel alone, minus umockdev's cost of sending the events to "
            f"one monitor socket that filters out everything; median of {REPEATS}. "
            "Plugin and testbed share this process, so the figures are upper bounds: "
            "they still hold umockdev's in-process delivery to the plugin's socket and "
            "the sentinel's variance (a few ms). Checked separately: under umockdev a "
            "monitor filtered to pci and drm receives 8 of 16 mixed NVMe/NIC events, so "
            "the NVMe ones never reach the plugin's code.",
            "Before this change (same harness, issue 15): every event batch rescanned "
            "every rule, 20-54 ms per scan on 8 MI300X, add medians 45-70 ms.",
        ],
    }


def _row(name: str, values: list[float], goal: str, stat: str = "median") -> dict[str, Any]:
    value = (median(values) if stat == "median" else percentile(values, 99.0)) * 1000
    out: dict[str, Any] = {"name": name, "value": round(value, 3), "unit": "ms", "goal": goal}
    if goal:
        out["ok"] = value <= float(goal.split()[1])
    return out


def run() -> dict[str, Any]:
    """Measure (re-running under umockdev-wrapper when needed); returns the numbers."""
    from hetero_dp_udev import testing

    if (why := testing.missing()) is not None:
        return {"skipped": why}
    if testing.under_preload():
        return asyncio.run(_measure())
    proc = subprocess.run(
        ["umockdev-wrapper", sys.executable, __file__, "--json"],
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
    outcome = run()
    print(json.dumps(outcome) if "--json" in sys.argv else json.dumps(outcome, indent=2))
