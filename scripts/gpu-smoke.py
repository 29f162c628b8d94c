#!/usr/bin/env python3
"""GPU smoke test: the NVIDIA backend against the real driver, through the fake kubelet.

On a machine with an NVIDIA GPU and driver (no Kubernetes needed):

    PYTHONPATH=.:vendors/nvidia python3 scripts/gpu-smoke.py [-o migStrategy=mixed ...]

It runs discovery, registration and ListAndWatch through hetero-dp's FakeKubelet
over real unix sockets, one Allocate, one XID-free health cycle (the watch thread
registered for XID events plus one check_health poll of every device), and prints
the device table, the Allocate response, the labels, the topology and the doctor
checks. Then it serves again with ``DEVICE_LIST_STRATEGY=cdi-cri`` and checks the CDI
spec written for the real driver (schema-valid, ``libcuda``/``libnvidia-ml`` of the
running version and ``nvidia-smi`` mounted, ``NVIDIA_VISIBLE_DEVICES=void``), and runs
the ``nvidia-device-plugin`` command with NVIDIA's flags against a fresh fake kubelet
(``--skip-command`` skips that). Where ``nvidia-cuda-mps-control`` is found it serves
the first whole GPU under ``sharing.mps`` with 4 replicas (``--skip-mps`` skips that):
the daemon must come up with a quarter of the GPU's memory and 25 % of its threads per client, a
replica's Allocate must carry the pipe directory, and a CUDA client started with that
pipe directory (libcuda through ctypes) must be able to allocate 0.9 of a quarter of the
memory but not 1.5 of it. It exits non-zero on any failure and gives up after
``--timeout`` seconds (90 by default). Options ``-o key=value`` are the backend's
(NVIDIA's names), values parsed as ``hetero-dp run -o nvidia.key=value`` parses them;
the NVIDIA env vars (MIG_STRATEGY ...) apply as in the DaemonSet.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "vendors/nvidia"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


async def smoke(options: dict[str, Any]) -> int:
    from hetero_dp_nvidia.backend import NvidiaBackend

    from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir

    t0 = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.2f}s] {msg}", flush=True)

    backend = NvidiaBackend(environ=os.environ)
    root = short_tempdir("hdp-smoke-")
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    runner = PluginRunner(kubelet.plugin_dir)
    try:
        step("starting hetero-dp with the NVIDIA backend against the fake kubelet")
        daemon = await runner.start(backend, options={"nvidia": options})
        physical = list(backend.node.gpus)
        step(
            f"NVML: driver {backend.node.driver_version}, CUDA "
            f"{'.'.join(map(str, backend.node.cuda_major_minor))}, {len(physical)} GPU(s)"
        )
        resources = sorted(daemon.resources)
        if not resources:
            print("FAIL: no devices discovered", file=sys.stderr)
            return 1
        rows = [["RESOURCE", "ID", "HEALTH", "NUMA", "PRODUCT", "MEMORY MiB", "PCI", "PARENT"]]
        for name in resources:
            devices = await kubelet.wait_devices(name, lambda d: len(d) > 0, timeout=20)
            for state in daemon.resources[name].state.physical_devices:
                a = state.attributes
                rows.append(
                    [
                        name,
                        state.id,
                        devices[state.id].health if state.id in devices else "?",
                        ",".join(map(str, devices[state.id].numa_nodes)) or "-",
                        str(a.get("productName", "")),
                        str(a.get("memoryMiB", "")),
                        str(a.get("pcieBusID", "")),
                        state.parent or "-",
                    ]
                )
        step("registered and streaming; device table (as the kubelet sees it):")
        print(_table(rows))

        name = resources[0]
        healthy = kubelet.resources[name].healthy_ids
        if not healthy:
            print(f"FAIL: no healthy device in {name}", file=sys.stderr)
            return 1
        resp = await kubelet.allocate(name, healthy[:1])
        step(f"Allocate {name} {healthy[:1]}:")
        print(f"  envs:    {dict(resp.envs)}")
        print(f"  mounts:  {[(m.host_path, m.container_path) for m in resp.mounts]}")
        print(f"  devices: {[(d.host_path, d.permissions) for d in resp.devices]}")
        if resp.envs.get("NVIDIA_VISIBLE_DEVICES", "") == "" and not resp.cdi_devices:
            print("FAIL: the response names no device", file=sys.stderr)
            return 1

        ready = await asyncio.to_thread(backend.monitor.ready.wait, 10)
        step(f"XID event set registered: {ready}")
        await daemon.poll_health()
        sick = [
            (n, d.id)
            for n in resources
            for d in kubelet.resources[n].devices.values()
            if not d.healthy
        ]
        step(f"health cycle done: {len(sick)} unhealthy")
        if not ready or sick:
            print(f"FAIL: health cycle: ready={ready} unhealthy={sick}", file=sys.stderr)
            return 1

        devices = [d for n in resources for d in daemon.resources[n].state.physical_devices]
        step("labels:")
        for k, v in sorted(backend.labels(devices).items()):
            print(f"  {k}={v}")
        links = backend.links(devices)
        step(f"topology: {len(links)} GPU pair(s)")
        for link in links:
            print(f"  {link.a} <-> {link.b}: {link.kind} score {link.score}")
        samples = backend.metrics(devices)
        step(
            f"metrics: {len(samples)} samples, e.g. "
            + ", ".join(f"{s.name}={s.value:g}" for s in samples[:4])
        )
        step("doctor:")
        for c in backend.doctor(options):
            print(f"  [{c.status}] {c.name}: {c.message}" + (f" (fix: {c.fix})" if c.fix else ""))
        return 0
    finally:
        await runner.stop_all()
        await kubelet.stop()
        backend.shutdown()
        shutil.rmtree(root, ignore_errors=True)


KIND = "k8s.device-plugin.nvidia.com/gpu"


def _spec_problems(spec: dict[str, Any]) -> list[str]:
    """Schema problems of the spec, when the repo's checker and jsonschema are here."""
    try:
        from tests.cdi.schema_check import cdi_spec_problems
    except ImportError as e:  # a copy without tests/ or without jsonschema
        print(f"  (CDI schema not checked: {e})")
        return []
    return list(cdi_spec_problems(spec))


async def cdi_smoke(options: dict[str, Any], step: Any) -> int:
    """DEVICE_LIST_STRATEGY=cdi-cri: the spec is written and carries the real driver."""
    import json

    from hetero_dp_nvidia.backend import NvidiaBackend

    from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir

    env = {**os.environ, "DEVICE_LIST_STRATEGY": "cdi-cri"}
    backend = NvidiaBackend(environ=env)
    root = short_tempdir("hdp-smoke-cdi-")
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    runner = PluginRunner(kubelet.plugin_dir)
    try:
        step("CDI: DEVICE_LIST_STRATEGY=cdi-cri, spec dir " + str(root / "cdi"))
        daemon = await runner.start(
            backend, config={"cdi": {"dir": str(root / "cdi")}}, options={"nvidia": options}
        )
        name = sorted(daemon.resources)[0]
        await kubelet.wait_devices(name, lambda d: len(d) > 0, timeout=20)
        first = next(iter(kubelet.resources[name].devices))
        resp = await kubelet.allocate(name, [first])
        print(f"  Allocate {name} [{first}]: cdi_devices {[c.name for c in resp.cdi_devices]}")
        if [c.name for c in resp.cdi_devices] != [f"{KIND}={first}"]:
            print("FAIL: CDI: the response does not name the device", file=sys.stderr)
            return 1
        files = list((root / "cdi").glob("*.json"))
        if len(files) != 1:
            print(f"FAIL: CDI: expected one spec file, found {files}", file=sys.stderr)
            return 1
        spec = json.loads(files[0].read_text())
        edits = spec.get("containerEdits", {})
        mounts = [m["containerPath"] for m in edits.get("mounts", [])]
        version = backend.node.driver_version
        print(f"  {files[0]}: cdiVersion {spec['cdiVersion']}, {len(spec['devices'])} devices")
        print(f"  env: {edits.get('env')}")
        print(f"  device nodes: {[n['path'] for n in edits.get('deviceNodes', [])]}")
        print(f"  mounts ({len(mounts)}):")
        for m in mounts:
            print(f"    {m}")
        for h in edits.get("hooks", []):
            print(f"  hook {h['path']} {' '.join(h['args'][1:4])} ...")
        missing = [
            lib
            for lib in (f"libcuda.so.{version}", f"libnvidia-ml.so.{version}", "nvidia-smi")
            if not any(m.endswith("/" + lib) for m in mounts)
        ]
        problems = _spec_problems(spec)
        if missing or problems or "NVIDIA_VISIBLE_DEVICES=void" not in edits.get("env", []):
            print(f"FAIL: CDI spec: missing {missing}, schema {problems}", file=sys.stderr)
            return 1
        step("CDI spec carries the driver")
        return 0
    finally:
        await runner.stop_all()
        await kubelet.stop()
        backend.shutdown()
        shutil.rmtree(root, ignore_errors=True)


async def command_smoke(step: Any) -> int:
    """``nvidia-device-plugin`` with NVIDIA's flags serves the GPUs to a fake kubelet."""
    import signal

    from hetero_dp.testing import FakeKubelet, short_tempdir

    root = short_tempdir("hdp-smoke-cmd-")
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    command = [sys.executable, "-m", "hetero_dp_nvidia.command"]
    command += ["--fail-on-init-error=true", "--device-list-strategy", "envvar"]
    command += ["--kubelet-dir", str(kubelet.plugin_dir), "--health-interval", "0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    step("nvidia-device-plugin " + " ".join(command[3:]))
    proc = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        await kubelet.wait_registered("nvidia.com/gpu", timeout=30)
        devices = await kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) > 0, timeout=20)
        resp = await kubelet.allocate("nvidia.com/gpu", [next(iter(devices))])
        step(f"nvidia-device-plugin: {len(devices)} GPU(s), Allocate envs {dict(resp.envs)}")
        if "NVIDIA_VISIBLE_DEVICES" not in resp.envs:
            print("FAIL: nvidia-device-plugin: no NVIDIA_VISIBLE_DEVICES", file=sys.stderr)
            return 1
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        out, _ = await proc.communicate()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
    if proc.returncode != 0:
        print(out.decode(errors="replace")[-3000:], file=sys.stderr)
        print(f"FAIL: nvidia-device-plugin exited {proc.returncode}", file=sys.stderr)
        return 1
    return 0


# A CUDA client, run with the MPS pipe directory: allocate `size` bytes on the visible
# GPU and print cuMemAlloc's result (0 = success, 2 = CUDA_ERROR_OUT_OF_MEMORY).
_CUDA_CLIENT = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def check(rc, what):
    if rc != 0:
        print(f"{what}: CUresult {rc}"); sys.exit(3)
check(cuda.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
ptr = ctypes.c_uint64()
print(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(sys.argv[1]))))
"""


def _mib(text: str) -> float:
    """``10240M``, ``10 G``, ``10.0G`` -> MiB (the daemon's answer; its format is guessed)."""
    import re

    m = re.match(r"^\s*([\d.]+)\s*([KMGT]?)", text.upper())
    if not m:
        return -1.0
    return (
        float(m.group(1))
        * {"K": 1 / 1024, "": 1 / 2**20, "M": 1, "G": 1024, "T": 2**20}[m.group(2)]
    )


async def mps_smoke(options: dict[str, Any], step: Any) -> int:
    """sharing.mps on one GPU: the daemon's limits, Allocate, and a client held to them."""
    import subprocess

    from hetero_dp_nvidia.backend import NvidiaBackend
    from hetero_dp_nvidia.mps import parse_mps_settings
    from hetero_dp_nvidia.mps_daemon import find_control

    from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir

    env = dict(os.environ)
    backend = NvidiaBackend(environ=env)
    root = short_tempdir("hdp-smoke-mps-")
    given = dict(options.get("mps") or {})
    settings = parse_mps_settings(given, str(root / "mps"))
    if find_control(settings, str(options.get("nvidiaDriverRoot", "/"))) is None:
        step("MPS: skipped, nvidia-cuda-mps-control not found")
        return 0
    probe = NvidiaBackend(environ=env)  # which whole GPU to share (MIG ones cannot be)
    probe.configure(options)
    whole = [d for d in probe.discover() if d.resource == "nvidia.com/gpu" and not d.parent]
    probe.shutdown()
    if not whole:
        step("MPS: skipped, no whole GPU under nvidia.com/gpu")
        return 0
    index = whole[0].index
    mps = {"checkInterval": 1, **given, "visibleRoot": str(root / "mps")}
    entry = {"name": "nvidia.com/gpu", "replicas": 4, "devices": [index]}
    sharing = {"mps": {"resources": [entry]}}
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    runner = PluginRunner(kubelet.plugin_dir)
    manager = None
    try:
        step(f"MPS: sharing.mps, GPU {index} x 4 replicas, root {root / 'mps'}")
        await runner.start(
            backend,
            config={"sharing": sharing},
            options={"nvidia": {**options, "mpsRoot": str(root / "mps"), "mps": mps}},
        )
        name = "nvidia.com/gpu"
        devices = await kubelet.wait_devices(
            name,
            lambda d: any("::" in i and x.healthy for i, x in d.items()),
            timeout=60,
        )
        manager = backend.mps
        gpu = next(g for g in backend.node.gpus if g.index == index)
        replica = next(i for i in devices if i.startswith(gpu.uuid + "::"))
        assert manager is not None
        daemon = manager.daemons()[name]
        threads = daemon.send("get_default_active_thread_percentage").strip()
        pinned = daemon.send(f"get_default_device_pinned_mem_limit {gpu.index}").strip()
        quarter = gpu.memory_mib // 4
        step(f"MPS daemon up: threads {threads!r}, pinned limit {pinned!r} (quarter {quarter}M)")
        if float(threads or 0) != 25.0 or abs(_mib(pinned) - quarter) > quarter / 100:
            print("FAIL: MPS: the daemon's limits are not a quarter", file=sys.stderr)
            return 1
        resp = await kubelet.allocate(name, [replica])
        step(f"MPS Allocate {replica}: envs {dict(resp.envs)}")
        if resp.envs.get("CUDA_MPS_PIPE_DIRECTORY") != "/mps/nvidia.com/gpu/pipe":
            print("FAIL: MPS: no CUDA_MPS_PIPE_DIRECTORY", file=sys.stderr)
            return 1
        client_env = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_dir,
            "CUDA_VISIBLE_DEVICES": gpu.uuid,
        }
        results = {}
        for frac in (0.9, 1.5):
            size = int(frac * quarter) * 1024 * 1024
            try:
                out = subprocess.run(
                    [sys.executable, "-c", _CUDA_CLIENT, str(size)],
                    env=client_env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            except subprocess.TimeoutExpired:
                print("FAIL: MPS: the CUDA client hung", file=sys.stderr)
                return 1
            if "libcuda.so.1" in out.stderr and "OSError" in out.stderr:
                step("MPS: client check skipped, no libcuda.so.1")
                return 0
            results[frac] = out.stdout.strip() or out.stderr.strip()[-300:]
            step(
                f"MPS client: cuMemAlloc of {frac} x quarter ({size >> 20} MiB) -> {results[frac]}"
            )
        if results[0.9] != "0" or results[1.5] == "0":
            print("FAIL: MPS: the client is not held to a quarter of the memory", file=sys.stderr)
            return 1
        step("MPS: a client is held to a quarter of the GPU's memory")
        return 0
    finally:
        await runner.stop_all()
        await kubelet.stop()
        backend.shutdown()
        if manager is not None:  # whatever happened, leave no daemon behind
            for d in manager.daemons().values():
                d.stop_quietly()
        shutil.rmtree(root, ignore_errors=True)


async def run_all(options: dict[str, Any], skip_command: bool, skip_mps: bool = False) -> int:
    t0 = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.2f}s] {msg}", flush=True)

    rc = await smoke(options)
    if rc == 0:
        rc = await cdi_smoke(options, step)
    if rc == 0 and not skip_command:
        rc = await command_smoke(step)
    if rc == 0 and not skip_mps:
        rc = await mps_smoke(options, step)
    if rc == 0:
        step("PASS")
    return rc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument(
        "--skip-command",
        action="store_true",
        help="do not run the nvidia-device-plugin command (it uses the driver's default paths)",
    )
    parser.add_argument("--skip-mps", action="store_true", help="do not run the MPS case")
    args = parser.parse_args()
    from hetero_dp.engine.config import set_option

    overrides: dict[str, Any] = {}
    for item in args.option:
        if "=" not in item:
            parser.error(f"-o {item}: expected KEY=VALUE")
        set_option(overrides, f"nvidia.{item}")  # as `hetero-dp run -o nvidia.KEY=VALUE`
    options = overrides.get("backends", {}).get("nvidia", {})
    try:
        return asyncio.run(
            asyncio.wait_for(run_all(options, args.skip_command, args.skip_mps), args.timeout)
        )
    except asyncio.TimeoutError:
        print(f"FAIL: not done within {args.timeout:g}s", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
