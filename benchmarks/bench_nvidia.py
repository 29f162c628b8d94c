"""NVIDIA backend benchmarks against the fake libnvidia-ml.so.1 (real pynvml, real sockets).

- XID event -> EventSink health call latency (backend only), whole GPU;
- XID event -> kubelet-visible Unhealthy (through the daemon and the fake kubelet's
  ListAndWatch stream), for a whole GPU and for every MIG slice of a GPU, in-process
  and with ``nvidia-device-plugin`` as its own process (against issue 21's goals);
- GetPreferredAllocation round trip on 8 GPUs, and the cost of the cached links hook;
- discovery time for 8 GPUs with MIG (one MIG GPU, and 56 MIG devices on 8 GPUs).

Run: ``PYTHONPATH=.:vendors/nvidia python benchmarks/bench_nvidia.py``.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "vendors/nvidia"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from benchmarks import median, percentile  # noqa: E402
from tests.nvidia.support import build_fake, make_node  # noqa: E402

ROUNDS = 50
KUBELET_ROUNDS = 20


def _stats(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "median_ms": round(median(ms), 3),
        "p95_ms": round(percentile(ms, 95.0), 3),
        "n": len(ms),
    }


def _load_fake(tmp: Path) -> ctypes.CDLL:
    import pynvml

    if pynvml.nvmlLib is not None and not hasattr(pynvml.nvmlLib, "fake_nvml_reset"):
        raise RuntimeError("a real libnvidia-ml is loaded; the benchmark needs the fake")
    lib = ctypes.CDLL(str(build_fake(tmp / "lib")), mode=ctypes.RTLD_GLOBAL)
    lib.fake_nvml_inject_xid.argtypes = [ctypes.c_uint, ctypes.c_ulonglong]
    lib.fake_nvml_wait_waiters.argtypes = [ctypes.c_int, ctypes.c_int]
    return lib


def _scenario(lib: ctypes.CDLL, root: Path, base: str, *extra: str) -> Any:
    node = make_node(lib, root, base, extra)
    lib.fake_nvml_reset()
    os.environ["FAKE_NVML_SCENARIO"] = str(node.scenario)
    return node


def _all_mig_lines() -> list[str]:
    lines = []
    for g in range(8):
        bus = ["07", "0F", "47", "4E", "87", "90", "B7", "BD"][g]
        lines.append(
            f'gpu uuid=GPU-{g:08x}-0000-4000-8000-000000000000 name="NVIDIA A100-SXM4-40GB" '
            f"minor={g} mem=40960 cc=8.0 pci=00000000:{bus}:00.0 numa={g // 4} mig=1 nvlinks=12"
        )
        for s in range(7):
            lines.append(
                f"mig gpu={g} uuid=MIG-{g:04x}{s:04x}-0000-4000-8000-000000000000 gi={7 + s} "
                f"ci=0 slices=1 mem=4864 gicap={100 + g * 20 + s} cicap={300 + g * 20 + s}"
            )
    return lines


def bench_discovery(lib: ctypes.CDLL, tmp: Path) -> dict[str, Any]:
    from hetero_dp_nvidia.backend import NvidiaBackend

    out = {}
    cases = {
        "8 GPUs, 1 in MIG mode (mixed)": ("a100-8x-nvlink.scn", ()),
        "8 GPUs x 7 MIG devices (mixed)": ("", tuple(_all_mig_lines())),
    }
    for i, (name, (base, extra)) in enumerate(cases.items()):
        node = _scenario(lib, tmp / f"disc{i}", base, *extra)
        b = NvidiaBackend(environ={"MIG_STRATEGY": "mixed", "PASS_DEVICE_SPECS": "true"})
        b.configure(node.options)
        samples = []
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            devices = b.discover()
            samples.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        b.links(devices)
        first_links = time.perf_counter() - t0
        cached = []
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            b.links(devices)
            cached.append(time.perf_counter() - t0)
        b.shutdown()
        out[name] = {
            "devices": len(devices),
            "discover": _stats(samples),
            "links_first_ms": round(first_links * 1000, 3),
            "links_cached": _stats(cached),
        }
    return out


async def bench_sink_latency(lib: ctypes.CDLL, tmp: Path) -> dict[str, Any]:
    """Inject -> EventSink.set_health callback on the loop (backend alone)."""
    from hetero_dp_nvidia.backend import NvidiaBackend

    from hetero_dp import EventSink

    node = _scenario(lib, tmp / "sink", "h100-8x.scn")
    b = NvidiaBackend(environ={})
    b.configure({**node.options, "recoveryQuietPeriod": 0.001})
    b.discover()
    loop = asyncio.get_running_loop()
    got: asyncio.Queue[tuple[float, str, bool]] = asyncio.Queue()
    sink = EventSink(
        loop, lambda i, h, r: got.put_nowait((time.perf_counter(), i, h)), lambda: None
    )
    task = asyncio.ensure_future(asyncio.to_thread(b.watch, sink))
    await asyncio.to_thread(b.monitor.ready.wait, 10)
    samples = []
    for n in range(ROUNDS):
        await asyncio.to_thread(lib.fake_nvml_wait_waiters, 1, 5000)
        t0 = time.perf_counter()
        lib.fake_nvml_inject_xid(n % 8, 79)
        t1, _, healthy = await asyncio.wait_for(got.get(), 5)
        assert not healthy
        samples.append(t1 - t0)
        _, _, healthy = await asyncio.wait_for(got.get(), 5)  # recovery
        assert healthy
    sink.stopping.set()
    await task
    b.shutdown()
    return _stats(samples)


async def bench_kubelet_latency(lib: ctypes.CDLL, tmp: Path) -> dict[str, Any]:
    """Inject -> Unhealthy in the fake kubelet's ListAndWatch view, GPU and MIG slices."""
    from hetero_dp_nvidia.backend import NvidiaBackend

    from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir

    node = _scenario(lib, tmp / "kubelet", "a100-8x-nvlink.scn")
    root = short_tempdir()
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    runner = PluginRunner(kubelet.plugin_dir)
    b = NvidiaBackend(environ={"MIG_STRATEGY": "mixed"})
    # The quiet period must outlast one publish, or the kubelet could see the recovery
    # before the failure; it only paces the rounds, it is not part of the measurement.
    await runner.start(b, options={"nvidia": {**node.options, "recoveryQuietPeriod": 0.1}})
    b.monitor.wait_ms = 200
    gpu, migs = node.uuid(1), node.mig_uuids(0)
    mig_res = {m["uuid"]: None for m in node.migs}
    await kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 7)
    for res in ("nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb"):
        devs = await kubelet.wait_devices(res, lambda d: len(d) > 0)
        for i in devs:
            mig_res[i] = res  # type: ignore[assignment]
    await asyncio.to_thread(b.monitor.ready.wait, 10)

    def health(res: str, i: str) -> bool:
        return kubelet.resources[res].devices[i].healthy

    async def one(index: int, targets: list[tuple[str, str]]) -> list[float]:
        await asyncio.to_thread(lib.fake_nvml_wait_waiters, 1, 5000)
        t0 = time.perf_counter()
        lib.fake_nvml_inject_xid(index, 79)
        seen: dict[tuple[str, str], float] = {}

        def all_seen() -> bool:
            for t in targets:
                if t not in seen and not health(*t):
                    seen[t] = time.perf_counter()
            return len(seen) == len(targets)

        await kubelet.wait_for(all_seen, 5)
        await kubelet.wait_for(lambda: all(health(*t) for t in targets), 5)  # recovered
        return [seen[t] - t0 for t in targets]

    whole, per_slice = [], []
    mig_targets = [(mig_res[m], m) for m in migs]
    for _ in range(KUBELET_ROUNDS):
        whole += await one(1, [("nvidia.com/gpu", gpu)])
        per_slice += await one(0, mig_targets)  # type: ignore[arg-type]
    await runner.stop_all()
    await kubelet.stop()
    return {"whole GPU": _stats(whole), f"each of {len(migs)} MIG slices": _stats(per_slice)}


async def bench_process_latency(lib: ctypes.CDLL, tmp: Path) -> dict[str, Any]:
    """The plugin as deployed: ``nvidia-device-plugin`` in its own process on the fake
    driver, the fake kubelet here; XIDs sent through the fake's control FIFO (its own
    thread injects them, as the kernel would). Inject -> Unhealthy in the kubelet's
    ListAndWatch view, whole GPU."""
    import subprocess

    from hetero_dp.testing import FakeKubelet, short_tempdir

    node = _scenario(lib, tmp / "process", "h100-8x.scn")
    root = short_tempdir()
    fifo = root / "control"
    os.mkfifo(fifo)
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(Path(lib._name).parent),
        "FAKE_NVML_SCENARIO": str(node.scenario),
        "FAKE_NVML_CONTROL": str(fifo),
        "PYTHONPATH": f"{ROOT}:{ROOT / 'vendors/nvidia'}",
    }
    command = [sys.executable, "-m", "hetero_dp_nvidia.command"]
    command += ["--nvidia-driver-root", str(node.root / "driver")]
    command += ["--kubelet-dir", str(kubelet.plugin_dir), "--health-interval", "0"]
    command += ["--log-level", "error", "-o", "nvidia.recoveryQuietPeriod=0.1"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    samples = []
    try:
        gpu = node.uuid(1)
        await kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8, 30)
        with open(fifo, "w") as control:
            for _ in range(KUBELET_ROUNDS):
                t0 = time.perf_counter()
                control.write("xid 1 79\n")
                control.flush()
                seen: list[float] = []

                def unhealthy(seen: list[float] = seen) -> bool:
                    if not kubelet.resources["nvidia.com/gpu"].devices[gpu].healthy:
                        seen.append(time.perf_counter())
                        return True
                    return False

                await kubelet.wait_for(unhealthy, 5)
                samples.append(seen[0] - t0)
                await kubelet.wait_for(
                    lambda: kubelet.resources["nvidia.com/gpu"].devices[gpu].healthy, 5
                )
    finally:
        proc.terminate()
        proc.wait(30)
        await kubelet.stop()
    return _stats(samples)


async def bench_preferred(lib: ctypes.CDLL, tmp: Path) -> dict[str, Any]:
    """GetPreferredAllocation on 8 H100s (NVSwitch): the engine's time in the plugin
    (links cached, IDs validated, set chosen), and the gRPC round trip around it."""
    from hetero_dp_nvidia.backend import NvidiaBackend

    from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir

    node = _scenario(lib, tmp / "preferred", "h100-8x.scn")
    root = short_tempdir()
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    runner = PluginRunner(kubelet.plugin_dir)
    daemon = await runner.start(NvidiaBackend(environ={}), options={"nvidia": node.options})
    await kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    resource = daemon.resources["nvidia.com/gpu"]
    ids = [g["uuid"] for g in node.gpus]
    in_plugin, round_trip = [], []
    for i in range(ROUNDS):
        must = [ids[i % 8]]
        t0 = time.perf_counter()
        await resource.preferred(ids, must, 4)
        in_plugin.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await kubelet.preferred_allocation("nvidia.com/gpu", ids, must, 4)
        round_trip.append(time.perf_counter() - t0)
    await runner.stop_all()
    await kubelet.stop()
    return {
        "in the plugin (8 GPUs, size 4, goal < 0.5 ms)": _stats(in_plugin),
        "gRPC round trip (8 GPUs, size 4)": _stats(round_trip),
    }


# Issue 21's comparison on the same fake driver and kubelet client: NVIDIA's plugin
# v0.20 took 2.25 ms (median) from XID to Unhealthy at the kubelet; the goal is at
# most that, and at most 6 ms with the plugin as its own process.
GOAL_XID_MS = 2.25
GOAL_XID_PROCESS_MS = 6.0


def _row(name: str, stats: dict[str, float], goal_ms: float | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": f"{name}, median of {stats['n']} (p95 {stats['p95_ms']:g} ms)",
        "value": stats["median_ms"],
        "unit": "ms",
    }
    if goal_ms is not None:
        row["goal"] = f"<= {goal_ms:g} ms"
        row["ok"] = stats["median_ms"] <= goal_ms
    return row


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-nvidia-") as d:
        tmp = Path(d)
        lib = _load_fake(tmp)
        discovery = bench_discovery(lib, tmp)
        sink = asyncio.run(bench_sink_latency(lib, tmp))
        kubelet = asyncio.run(bench_kubelet_latency(lib, tmp))
        process = asyncio.run(bench_process_latency(lib, tmp))
        preferred = asyncio.run(bench_preferred(lib, tmp))
        lib.fake_nvml_reset()
    rows = [
        _row("XID -> EventSink.set_health on the loop (backend alone)", sink),
        _row("XID -> Unhealthy at the kubelet, whole GPU, in-process", kubelet["whole GPU"]),
        _row(
            "XID -> Unhealthy at the kubelet, each of 4 MIG slices, in-process",
            kubelet["each of 4 MIG slices"],
        ),
        _row(
            "XID -> Unhealthy at the kubelet, whole GPU, nvidia-device-plugin as its own "
            "process (XID from the fake's control FIFO)",
            process,
            GOAL_XID_PROCESS_MS,
        ),
    ]
    rows[1]["goal"], rows[1]["ok"] = f"<= {GOAL_XID_MS:g} ms", rows[1]["value"] <= GOAL_XID_MS
    for label, figures in discovery.items():
        rows.append(_row(f"discover, {label} ({figures['devices']} devices)", figures["discover"]))
        rows.append(_row(f"links cached, {label}", figures["links_cached"]))
    for label, figures in preferred.items():
        goal = 0.5 if "in the plugin" in label else None
        rows.append(
            _row(f"GetPreferredAllocation {label}".replace(", goal < 0.5 ms", ""), figures, goal)
        )
    return {
        "title": "NVIDIA backend (fake libnvidia-ml.so.1, real pynvml, real sockets)",
        "rows": rows,
        "notes": [
            "XID goals from issue 21: NVIDIA's plugin v0.20 took 2.25 ms (median) from "
            "XID to Unhealthy at the kubelet on the same fake driver and kubelet client; "
            "ours must not be slower (in-process row), and stay within 6 ms with the "
            "plugin as its own process (the deployed shape; the row includes the FIFO "
            "write and a second interpreter's scheduling on a shared 2-core machine).",
            "The fake wakes a blocked nvmlEventSetWait at once (as the driver does); the "
            "kubelet side waits on a condition signalled by each ListAndWatch message.",
        ],
    }


if __name__ == "__main__":
    import json
    import logging

    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("hetero_dp").setLevel(logging.CRITICAL)  # every round logs an XID
    print(json.dumps(run(), indent=2))  # or: python3 -m benchmarks bench_nvidia
