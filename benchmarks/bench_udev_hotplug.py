"""Hotplug of the udev backend on realistic 8-device nodes: uevent to kubelet update.

Two nodes (:mod:`hetero_dp_udev.testing` says what is sourced and what guessed):
eight AMD MI300X GPUs, each behind its own PCIe switch shared with a NIC and an
NVMe drive (``mi300x_tree``, rule set ``amd-gpu``), and eight Gaudi2 cards, two per
switch (``gaudi2_tree``, rule set ``gaudi``, parentless control nodes). The real
daemon serves a FakeKubelet over unix sockets. Measured per node:

- one full scan of the tree (what every event cost before discovery became
  incremental; still what start-up and the framework's interval pay);
- a device unplugged (its function and children removed, remove uevents children
  first) and plugged again: from the moment the testbed has sent the uevents
  until the FakeKubelet holds the new device list; median and p99;
- a driver unbind and bind: until the kubelet sees Unhealthy, then Healthy;
- the plugin's CPU for 100 unrelated uevents: NVMe changes (another subsystem,
  dropped by the kernel-side filter) and changes on a NIC's PCI function (a
  subsystem the rules listen to, so they reach the plugin and are found to concern
  no device). CPU is this process's CPU time around the events plus a sentinel
  unbind/bind round the kubelet sees, minus the sentinel round alone and minus
  umockdev's own cost of sending the events to a monitor socket that filters out
  everything; the median of several repetitions, an upper bound.

Goals (issue 15): add and remove median <= 10 ms, p99 <= 20 ms; 100 unrelated
events < 20 ms of plugin CPU in all.

umockdev's preload library must be loaded at process start, so ``run()`` runs each
node in a child process under ``umockdev-wrapper``; without umockdev it returns
``{"skipped": reason}``.

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

PLUGS = 300  # each: one unplug and one plug; p99 is then the 4th-largest, not the 2nd
FLIPS = 50  # each: one unbind and one bind
UNRELATED = 100
REPEATS = 15


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(median(values) * 1000, 3),
        "p99_ms": round(percentile(values, 99.0) * 1000, 3),
        "n": len(values),
    }


def _paths(tree: str, marker: str) -> list[str]:
    """The sysfs paths of the tree's blocks that contain ``marker`` (a line)."""
    return ["/sys" + b.split("\n", 1)[0][3:] for b in tree.split("\n\n") if marker in b]


async def _scenario(sc: dict[str, Any]) -> dict[str, Any]:
    import pyudev
    from hetero_dp_udev import UdevBackend
    from hetero_dp_udev.backend import options
    from hetero_dp_udev.testing import Testbed

    from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir

    root = short_tempdir("hdp-bench-")
    resource, rules, tree = sc["resource"], sc["rules"], sc["tree"]
    plug_id, flip_id, flip_path = sc["plug_id"], sc["flip_id"], sc["flip_path"]
    nvme = _paths(tree, "E: SUBSYSTEM=nvme")
    nic = _paths(tree, "A: vendor=0x15b3")
    add: list[float] = []
    remove: list[float] = []
    unbind: list[float] = []
    bind: list[float] = []
    scans: list[float] = []
    cpu: dict[str, list[float]] = {"filtered": [], "listened": []}
    try:
        with Testbed() as bed:
            bed.add(tree)
            probe = UdevBackend()
            probe.configure(options({"rules": [rules]}))
            for _ in range(20):
                begin = time.perf_counter()
                devices = probe.discover()
                scans.append(time.perf_counter() - begin)
            assert len(devices) == 8, devices

            async def send(kind: str) -> None:
                for n in range(UNRELATED):
                    if kind == "filtered":
                        bed.uevent(nvme[n % len(nvme)], "change")
                    else:
                        bed.uevent(nic[n % len(nic)], "change")
                    if n % 5 == 4:
                        # umockdev's unix socket queues 10 datagrams (max_dgram_qlen);
                        # the plugin reads on this loop, so let it run (a real kernel
                        # would drop them with ENOBUFS instead of failing the sender)
                        await asyncio.sleep(0)

            # umockdev's own cost of sending, to one listening socket as in the real
            # run (sendmsg and the socket filter run in this process under umockdev,
            # in the kernel on a real host), whose filter drops everything
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
                    await runner.start(UdevBackend(), options={"udev": {"rules": [rules]}})
                    await kubelet.wait_devices(resource, lambda d: len(d) == 8)

                    async def flip() -> tuple[float, float]:
                        sent = time.perf_counter()
                        bed.unbind_driver(flip_path)
                        await kubelet.wait_devices(
                            resource, lambda d: d[flip_id].health == "Unhealthy"
                        )
                        middle = time.perf_counter()
                        bed.bind_driver(flip_path, sc["driver"])
                        await kubelet.wait_devices(
                            resource, lambda d: d[flip_id].health == "Healthy"
                        )
                        return middle - sent, time.perf_counter() - middle

                    for n in range(PLUGS):
                        for path in sc["unplug"](n):
                            bed.remove(path)
                        sent = time.perf_counter()
                        await kubelet.wait_devices(resource, lambda d: plug_id not in d)
                        remove.append(time.perf_counter() - sent)
                        bed.add(sc["plug"](n))
                        sent = time.perf_counter()
                        await kubelet.wait_devices(
                            resource,
                            lambda d: plug_id in d and d[plug_id].health == "Healthy",
                        )
                        add.append(time.perf_counter() - sent)
                    for _ in range(FLIPS):
                        down, up = await flip()
                        unbind.append(down)
                        bind.append(up)
                    for _ in range(REPEATS):
                        for kind in cpu:
                            begin = time.process_time()
                            await flip()
                            alone = time.process_time() - begin
                            begin = time.process_time()
                            await send(kind)
                            await flip()
                            total = time.process_time() - begin
                            cpu[kind].append(total - alone - floors[kind])
                finally:
                    await runner.stop_all()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    label = sc["label"]
    filtered = round(median(cpu["filtered"]) * 1000, 2)
    listened = round(median(cpu["listened"]) * 1000, 2)
    return {
        "rows": [
            _row(f"{label}: full scan (start-up, interval; was: every event)", scans, ""),
            _row(f"{label}: plugged to kubelet update, median", add, "<= 10 ms", "median"),
            _row(f"{label}: plugged to kubelet update, p99", add, "<= 20 ms", "p99"),
            _row(f"{label}: plugged to kubelet update, max", add, "", "max"),
            _row(f"{label}: unplugged to kubelet update, median", remove, "<= 10 ms", "median"),
            _row(f"{label}: unplugged to kubelet update, p99", remove, "<= 20 ms", "p99"),
            _row(f"{label}: unplugged to kubelet update, max", remove, "", "max"),
            _row(f"{label}: driver unbind to Unhealthy at the kubelet, median", unbind, ""),
            _row(f"{label}: driver bind to Healthy at the kubelet, median", bind, ""),
            {
                "name": f"{label}: plugin process CPU for {UNRELATED} NVMe events (filtered "
                "out: by the kernel on a host, by umockdev in this process here)",
                "value": filtered,
                "unit": "ms",
                "goal": "",
            },
            {
                "name": f"{label}: plugin process CPU for {UNRELATED} NIC pci change events, "
                "under umockdev",
                "value": listened,
                "unit": "ms",
                "goal": "",
            },
            {
                "name": f"{label}: plugin CPU for {UNRELATED} NIC pci change events beyond "
                "umockdev's delivery (the two rows above, NIC minus NVMe)",
                "value": round(listened - filtered, 2),
                "unit": "ms",
                "goal": "< 20 ms",
                "ok": listened - filtered < 20,
            },
        ],
        "note": f"{label}: {sc['about']}",
    }


def _scenarios() -> list[dict[str, Any]]:
    from hetero_dp_udev.testing import gaudi2_card, gaudi2_tree, mi300x_gpu, mi300x_tree

    _, amd_plug = mi300x_gpu(7, 0, 0)
    _, amd_flip = mi300x_gpu(0, 0, 0)
    _, gaudi_plug, gaudi_control = gaudi2_card(7, 7)
    _, gaudi_flip, _ = gaudi2_card(0, 0)
    return [
        {
            "label": "8x MI300X",
            "about": "eight MI300X GPUs, each behind a PCIe switch with a NIC and an NVMe "
            "drive, a BMC VGA, /dev/kfd, chipset devices (~190 devices), rule set amd-gpu; "
            "a GPU unplugged with its drm, hwmon and i2c children and plugged again "
            "(fresh DRM minors each time: umockdev 0.17 aborts when a node name returns).",
            "tree": mi300x_tree(),
            "rules": "amd-gpu",
            "resource": "amd.com/gpu",
            "driver": "amdgpu",
            "unplug": lambda n: [amd_plug],
            "plug": lambda n: mi300x_gpu(7, card=100 + n, render=1000 + n)[0],
            "plug_id": amd_plug.rsplit("/", 1)[1],
            "flip_path": amd_flip,
            "flip_id": amd_flip.rsplit("/", 1)[1],
        },
        {
            "label": "8x Gaudi2",
            "about": "eight Gaudi2 cards, two per PCIe switch with a NIC and an NVMe drive, "
            "chipset devices (~90 devices), rule set gaudi; a card unplugged with its accel "
            "node and its parentless control node and plugged again (fresh accel indices "
            "each time, for the same umockdev reason).",
            "tree": gaudi2_tree(),
            "rules": "gaudi",
            "resource": "habana.ai/gaudi",
            "driver": "habanalabs",
            # the control node is parentless: it goes with the card, by its own path
            "unplug": lambda n: [
                gaudi_plug,
                gaudi_control if n == 0 else gaudi2_card(7, 99 + n)[2],
            ],
            "plug": lambda n: gaudi2_card(7, 100 + n)[0],
            "plug_id": gaudi_plug.rsplit("/", 1)[1],
            "flip_path": gaudi_flip,
            "flip_id": gaudi_flip.rsplit("/", 1)[1],
        },
    ]


def _report(results: list[dict[str, Any]]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for result in results:
        rows += result["rows"]
        notes.append(result["note"])
    return {
        "title": "udev backend: hotplug on 8-device nodes",
        "rows": rows,
        "notes": [
            *notes,
            "Each node runs in its own interpreter under umockdev-wrapper, the daemon in "
            "that process (PluginRunner) serving a FakeKubelet over unix sockets. "
            f"Plug/unplug {PLUGS} times each, driver flips {FLIPS} times; clock from the "
            "testbed having sent the uevents to the kubelet's device list; p99 of "
            f"{PLUGS} samples is their 4th-largest (nearest rank).",
            "The largest samples (the max rows) are single stalls of 10-25 ms, not the "
            "plugin's work. Looked into on 8x MI300X: one recurs in every run at the 96th "
            "plug, whatever the device names and on ext4 or tmpfs alike; there the "
            "discovery's thread takes 12-22 ms of wall time for 3-4 ms of CPU (thread "
            "time) while the other core idles and no other Python thread holds the GIL "
            "(a sampling thread saw the loop in select), with no hypervisor steal in that "
            "window (/proc/stat); under perf, sampling or tracing, it does not occur. "
            "Other stalls come and go with the machine's load and steal (about 3% of CPU "
            "time on this 2-vCPU VM, in bursts). With 100 samples p99 was the 2nd-largest "
            "and read 6-24 ms across runs on one day; 300 samples estimate it better.",
            "CPU: process CPU time around the events plus a sentinel unbind/bind round, "
            "minus the sentinel alone, minus umockdev's cost of sending the events to "
            f"one monitor socket that filters out everything; median of {REPEATS}. "
            "Plugin and testbed share this process, so the figures are upper bounds: "
            "they still hold umockdev's in-process delivery to the plugin's socket and "
            "the sentinel's variance (a few ms). Checked separately: under umockdev a "
            "monitor filtered to pci and drm receives 8 of 16 mixed NVMe/NIC events, so "
            "the NVMe ones never reach the plugin's code, yet their row reads 10-21 ms "
            "across runs on one quiet 2-core machine (14-29 ms with the plugin moved to a "
            "process of its own, its threads' schedstat): umockdev's user-space delivery "
            "and filtering in the receiving process, which a real kernel does in the "
            "kernel. NIC events pay that delivery too, so the goal (issue 15: 100 "
            "unrelated events under 20 ms of plugin CPU) is judged on the NIC row minus "
            "the NVMe row: what the plugin's own code (libudev's parsing, pyudev, the "
            "backend) spends on them; on a host the NVMe events do not wake it at all.",
            "Change events of a device no rule can match (the NIC) are read and dropped "
            "without a discovery; before (same harness), each batch of them asked for one, "
            "about 20 per 100 events.",
            "Before this change (same harness, issue 15): every event batch rescanned "
            "every rule, 20-54 ms per scan on 8 MI300X and 9-12 ms on 8 Gaudi2, add "
            "medians 45-70 ms.",
        ],
    }


def _row(name: str, values: list[float], goal: str, stat: str = "median") -> dict[str, Any]:
    pick = {"median": median, "max": max}.get(stat, lambda v: percentile(v, 99.0))
    value = pick(values) * 1000
    out: dict[str, Any] = {"name": name, "value": round(value, 3), "unit": "ms", "goal": goal}
    if goal:
        out["ok"] = value <= float(goal.split()[1])
    return out


def run() -> dict[str, Any]:
    """Measure each node in its own process under umockdev-wrapper (a clean
    interpreter each, as ``python -m benchmarks`` gives each module); returns the
    numbers."""
    from hetero_dp_udev import testing

    if (why := testing.missing()) is not None:
        return {"skipped": why}
    results = []
    for index in range(len(_scenarios())):
        proc = subprocess.run(
            ["umockdev-wrapper", sys.executable, __file__, "--scenario", str(index)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark under umockdev-wrapper failed:\n{proc.stderr[-4000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return _report(results)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--scenario":
        print(json.dumps(asyncio.run(_scenario(_scenarios()[int(sys.argv[2])]))))
    else:
        print(json.dumps(run(), indent=2))
