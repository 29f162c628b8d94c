"""CDI specs consumed by a real runtime: podman reads specs from /etc/cdi and
/var/run/cdi and, for ``podman run --device vendor.com/class=name``, injects the
device's nodes, env and mounts and runs its hooks (podman-run(1), ``--device``; the
CDI spec, github.com/cncf-tags/container-device-interface SPEC.md).

The specs come from the backends as they run: a test backend through the core's CDI
writer, the bundled ``simulated`` backend served by the daemon (device-plugin mode and
DRA), the NVIDIA image's plugin (device-plugin mode) and ``hetero-dp run nvidia --mode
dra`` as a process of its own on the fake NVML (a DRA claim spec). Each test writes the
spec as the plugin does, starts a short-lived container with the CDI name the plugin
answered in Allocate, and checks from inside what the container got. The host's CDI
dirs stay untouched (a spec there is offered to every container on the machine):
podman 4.3 reads specs only from /etc/cdi and /var/run/cdi (no --cdi-spec-dir, no
cdi_spec_dirs in containers.conf before podman 4.5), so it runs in a mount namespace
of its own (unshare(1)) whose /etc is an overlay (mount(8), overlay) with the test's
spec dir as /etc/cdi; what podman writes to /etc goes into the overlay too. Device
nodes must be real: the fake ones are character devices made with mknod (a GPU's
195:<minor>, as NVIDIA's driver numbers them; generic ones 1:3, the numbers of
/dev/null), so the runtime can create them in the container.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from hetero_dp import Device, DeviceNode, Mount, hookimpl
from tests.nvidia.driver_root import VERSION, build_ld_cache, make_driver_root
from tests.nvidia.support import FakeNode, make_node

from .conftest import KubeletThread, free_port, missing
from .test_nvidia_pods import CHART, check_serves_and_stops, render, start_pod

# Runs its arguments with /etc overlaid by $1 (upper) and $2 (work), in this namespace.
PRIVATE_ETC = (
    'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc'
    ' && shift 2 && exec "$@"'
)


def private_etc(upper: Path, work: Path, cmd: list[str]) -> list[str]:
    """``cmd`` in a mount namespace of its own whose /etc shows ``upper`` over the host's
    (``upper/cdi`` is its /etc/cdi); nothing it writes under /etc reaches the host."""
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    ns = ["unshare", "--mount", "--propagation", "private"]
    return [*ns, "sh", "-c", PRIVATE_ETC, "sh", str(upper), str(work), *cmd]


@pytest.fixture
def runtime_cdi(engine, tmp_path_factory) -> Any:
    """``consume(spec_path, name, script)`` -> the container's output: starts ``sh -c
    script`` with ``--device name``, podman seeing the spec in a private /etc/cdi."""
    if engine.kind != "podman":
        pytest.skip("CDI is checked under podman: docker's daemon reads only the host's dirs")
    scratch = tmp_path_factory.mktemp("etc")
    if subprocess.run(private_etc(scratch / "u", scratch / "w", ["true"])).returncode != 0:
        missing("cannot overlay /etc in a mount namespace of its own (unshare, overlay)")
    base = None

    def consume(spec: Path, name: str, script: str) -> subprocess.CompletedProcess[str]:
        nonlocal base
        if base is None:
            import build_images

            base = build_images.base_image(engine)
        spec_dir = scratch / "u" / "cdi"
        spec_dir.mkdir(exist_ok=True)
        shutil.copy(spec, spec_dir / f"hetero-dp-deploytest-{uuid.uuid4().hex[:8]}.json")
        run = [*engine.cmd("run", "--rm"), *engine.run_flags, "--network", "none",
               "--pull", "never", "--device", name, base, "sh", "-c", script]  # fmt: skip
        return subprocess.run(
            private_etc(scratch / "u", scratch / "w", run),
            capture_output=True,
            text=True,
            timeout=120,
        )

    return consume


def mknod(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))


class Accel:
    """A generic backend whose records carry a node, a mount and env (as udev's and
    the simulated backend's do), all through the core's CDI writer."""

    hetero_dp_name = "accel"

    def __init__(self, root: Path) -> None:
        self.root = root

    @hookimpl
    def discover(self) -> list[Device]:
        return [
            Device(
                id=f"accel{i}",
                resource="acme.com/accel",
                nodes=(DeviceNode(str(self.root / f"dev/accel{i}"), f"/dev/accel{i}"),),
                mounts=(Mount(str(self.root / "opt/acme"), "/opt/acme", shared=True),),
                env={"ACME_VISIBLE_DEVICES": str(i), "ACME_DRIVER": "2.1"},
            )
            for i in range(2)
        ]


async def allocated_spec(
    kubelet, runner, backend: Any, resource: str, device: str, count: int, **start: Any
) -> tuple[Path, str]:
    """Device-plugin mode: serve ``backend`` with ``resource`` delivered as cdi-cri into
    a CDI dir of the runner's own, Allocate ``device``: (the spec, the CDI name)."""
    cdi_dir = Path(runner.plugin_dir).parent / "cdi"
    config = {
        "cdi": {"enabled": True, "dir": str(cdi_dir)},
        "resources": {resource: {"deliver": ["cdi-cri"]}},
    }
    await runner.start(backend, config=config, **start)
    await kubelet.wait_devices(resource, lambda d: len(d) == count)
    r = await kubelet.allocate(resource, [device])
    [name] = [c.name for c in r.cdi_devices]
    [spec] = cdi_dir.glob("*.json")
    return spec, name


@asynccontextmanager
async def dra_node() -> AsyncIterator[Any]:
    """A DRA node: the stand-in API server, a DRARunner's layout under a short temp dir
    and a FakeDRAKubelet watching its registry; every daemon started is stopped after."""
    pytest.importorskip("kubernetes")  # DRA mode's optional dependency
    from hetero_dp.testing import short_tempdir
    from hetero_dp.testing.dra import DRARunner, FakeAPIServer, FakeDRAKubelet

    root = short_tempdir("hdep-")
    with FakeAPIServer() as api:
        runner = DRARunner(root, api)
        kubelet = FakeDRAKubelet(runner.registry_dir)
        await kubelet.start()
        try:
            yield runner, kubelet
        finally:
            await runner.stop_all()
            await kubelet.stop()
            shutil.rmtree(root, ignore_errors=True)


async def claim_spec(runner, kubelet, driver: str, device: str, keep: Path) -> tuple[Path, str]:
    """A claim for ``device`` (a device ID of ``driver``), prepared as the kubelet does:
    (the claim's spec, copied into ``keep``, and the CDI name NodePrepareResources
    answered)."""
    from hetero_dp.dra import device_name
    from hetero_dp.testing.dra import ClaimRef, make_claim

    await kubelet.wait_registered(driver, timeout=60)
    await runner.api.wait_for(lambda: device_name(device) in runner.api.devices_of(driver))
    claim = make_claim("c1", [("dev", device_name(device))], driver=driver, pool="node-a")
    ref = ClaimRef.of(runner.api.add_claim(claim))
    entry = (await kubelet.node_prepare(driver, [ref])).claims[ref.uid]
    assert entry.error == ""
    [name] = [i for d in entry.devices for i in d.cdi_device_ids]
    for path in runner.cdi_dir.glob("*.json"):
        spec = json.loads(path.read_text())
        if any(name == f"{spec['kind']}={d['name']}" for d in spec["devices"]):
            keep.mkdir(parents=True, exist_ok=True)
            return Path(shutil.copy(path, keep / path.name)), name
    raise AssertionError(f"no spec in {runner.cdi_dir} names {name}")


def acme_host(root: Path) -> Path:
    """The host side of :class:`Accel`: two nodes (1:3) and the driver's shared dir."""
    for i in range(2):
        mknod(root / f"dev/accel{i}", 1, 3)
    (root / "opt/acme").mkdir(parents=True)
    (root / "opt/acme/driver.txt").write_text("acme driver 2.1\n")
    return root


# Env that differs per device (the VISIBLE_DEVICES lists) is joined over the devices
# allocated together, so in device-plugin mode Allocate answers it and the spec leaves
# it out (hetero_dp/allocation/cdi.py, list_env_keys); a claim's spec carries it.
ACME_SCRIPT = (
    'stat -c "%F %t:%T" /dev/accel1; echo "driver=$ACME_DRIVER visible=$ACME_VISIBLE_DEVICES"; '
    "cat /opt/acme/driver.txt"
)


def acme_sees(visible: str) -> list[str]:
    return ["character special file 1:3", f"driver=2.1 visible={visible}", "acme driver 2.1"]


# the simulated backend delivers /dev/null at /dev/sim<N> and SIM_VISIBLE_DEVICES, no mount
SIM_SCRIPT = 'stat -c "%F %t:%T" /dev/sim1; echo "visible=$SIM_VISIBLE_DEVICES"'


def sim_sees(visible: str) -> list[str]:
    return ["character special file 1:3", f"visible={visible}"]


def sees(out: subprocess.CompletedProcess[str], expected: list[str]) -> None:
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected


async def test_a_generic_backends_spec_gives_the_container_its_node_env_and_mount(
    fake_kubelet, plugin_runner, tmp_path, runtime_cdi
):
    host = acme_host(tmp_path / "host")
    spec, name = await allocated_spec(
        fake_kubelet, plugin_runner, Accel(host), "acme.com/accel", "accel1", 2
    )
    sees(runtime_cdi(spec, name, ACME_SCRIPT), acme_sees(visible=""))


async def test_the_simulated_backends_spec_gives_the_container_its_node_and_env(
    fake_kubelet, plugin_runner, runtime_cdi
):
    """The bundled ``simulated`` backend as the daemon serves it, cdi-cri delivery."""
    from hetero_dp_simulated import SimulatedBackend

    spec, name = await allocated_spec(
        fake_kubelet, plugin_runner, SimulatedBackend(), "hetero-dp.io/sim", "sim1", 2,
        options={"simulated": {"count": 2}},
    )  # fmt: skip
    sees(runtime_cdi(spec, name, SIM_SCRIPT), sim_sees(visible=""))


async def test_a_dra_claims_spec_gives_the_container_its_node_env_and_mount(tmp_path, runtime_cdi):
    """DRA mode: the per-claim spec NodePrepareResources writes starts a container with
    the claimed device's node, env and mount."""
    host = acme_host(tmp_path / "host")
    async with dra_node() as (runner, kubelet):
        await runner.start(Accel(host))
        spec, name = await claim_spec(runner, kubelet, "accel.acme.com", "accel1", tmp_path)
    sees(runtime_cdi(spec, name, ACME_SCRIPT), acme_sees(visible="1"))


async def test_the_simulated_backends_dra_claim_spec_gives_the_container_its_node_and_env(
    tmp_path, runtime_cdi
):
    from hetero_dp_simulated import SimulatedBackend

    async with dra_node() as (runner, kubelet):
        await runner.start(SimulatedBackend(), options={"simulated": {"count": 2}})
        spec, name = await claim_spec(runner, kubelet, "sim.hetero-dp.io", "sim1", tmp_path)
    sees(runtime_cdi(spec, name, SIM_SCRIPT), sim_sees(visible="1"))


def gpu_driver_root(fake: FakeNode, ctk_calls: Path) -> tuple[Path, Path]:
    """The fake node's driver root made real enough for a runtime: the driver's files
    and ld cache, the GPUs' nodes (195:<minor>), nvidiactl (195:255) and the UVM nodes
    as character devices, and a stand-in nvidia-ctk that records its calls to
    ``ctk_calls``: (the driver root, the nvidia-ctk)."""
    driver = fake.root / "driver"
    make_driver_root(driver)
    build_ld_cache(driver)
    for g in fake.gpus:
        mknod(driver / f"dev/nvidia{g.get('minor', '0')}", 195, int(g.get("minor", "0")))
    mknod(driver / "dev/nvidiactl", 195, 255)
    mknod(driver / "dev/nvidia-uvm", 510, 0)
    mknod(driver / "dev/nvidia-uvm-tools", 510, 1)
    ctk = driver / "usr/bin/nvidia-ctk"
    ctk.write_text(f'#!/bin/sh\necho "$*" >> {ctk_calls}\n')
    ctk.chmod(0o755)
    return driver, ctk


def sees_the_gpu(runtime_cdi, spec_path: Path, name: str, visible: str, ctk_calls: Path) -> None:
    """The container started with CDI device ``name`` of the NVIDIA spec sees the GPU's
    node, nvidiactl, the driver's libraries of the running version and
    NVIDIA_VISIBLE_DEVICES=``visible``; the spec's createContainer hooks ran."""
    spec = json.loads(spec_path.read_text())
    device = next(d for d in spec["devices"] if name.endswith("=" + d["name"]))
    [gpu_node] = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    minor = int(gpu_node.removeprefix("/dev/nvidia"))
    lib = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    out = runtime_cdi(
        spec_path,
        name,
        f'stat -c "%F %t:%T %n" {gpu_node} /dev/nvidiactl; '
        f'echo "visible=$NVIDIA_VISIBLE_DEVICES"; ls {lib}',
    )
    sees(out, [
        f"character special file c3:{minor:x} {gpu_node}",
        "character special file c3:ff /dev/nvidiactl",
        f"visible={visible}",
        lib,
    ])  # fmt: skip
    recorded = ctk_calls.read_text().splitlines()
    assert any(c.startswith("hook update-ldcache") for c in recorded), recorded
    assert any(c.startswith("hook create-symlinks") for c in recorded), recorded


def test_the_nvidia_spec_gives_nodes_libraries_env_and_runs_its_hooks(
    image,
    engine,
    workdir: Path,
    kubelet: KubeletThread,
    nvidia_node,
    pods,
    runtime_cdi,
):
    """The NVIDIA image, cdi-cri, a driver root with the driver's files: the spec it
    writes starts a container with the GPU's node, the control nodes, the driver's
    libraries of the running version and NVIDIA_VISIBLE_DEVICES=void, and runs its
    createContainer hooks through the nvidia-ctk the chart names (a stand-in that records
    its calls)."""
    tag = image("nvidia")
    node, fake = nvidia_node()
    calls = workdir / "nvidia-ctk-calls"
    driver, ctk = gpu_driver_root(fake, calls)
    port = free_port()
    template, maps = render(
        "-f", str(CHART / "values-cdi-cri.yaml"), "--set", f"metrics.port={port}",
        "--set", f"nvidiaDriverRoot={driver}", "--set", f"cdi.nvidiaHookPath={ctk}",
    )  # fmt: skip
    node.host_paths.update({str(driver): driver, f"{driver}/dev": driver / "dev"})
    pod = start_pod(engine, template, node, workdir, pods, maps, images={tag: tag})
    r = check_serves_and_stops(pod, kubelet, port)
    [name] = [c.name for c in r.cdi_devices]
    [spec_path] = (workdir / "cdi").glob("*.json")
    sees_the_gpu(runtime_cdi, spec_path, name, "void", calls)


async def test_the_nvidia_dra_claim_spec_gives_nodes_libraries_env_and_runs_its_hooks(
    workdir: Path, fake_lib: Path, hetero_dp_cmd, cli_env, runtime_cdi
):
    """``hetero-dp run nvidia --mode dra`` (cdi-cri: devices travel as nodes) as a
    process of its own on the fake NVML and a driver root with the driver's files: the
    spec it writes for a claim of one GPU starts a container with that GPU's node, the
    control nodes, the driver's libraries and NVIDIA_VISIBLE_DEVICES=void, and runs its
    hooks."""
    pytest.importorskip("hetero_dp_nvidia")
    from tests.dra.test_cli import spawn, wait_exit

    fake = make_node(None, workdir / "node", "h100-8x.scn")  # type: ignore[arg-type]
    calls = workdir / "nvidia-ctk-calls"
    driver, ctk = gpu_driver_root(fake, calls)
    env = {
        "LD_LIBRARY_PATH": str(fake_lib.parent),
        "FAKE_NVML_SCENARIO": str(fake.scenario),
        "NVIDIA_CDI_HOOK_PATH": str(ctk),
        "DEVICE_LIST_STRATEGY": "cdi-cri",
    }
    opts = {
        "nvidiaDriverRoot": driver,
        "sysfsRoot": fake.root / "sys",
        "procRoot": fake.root / "proc",
    }
    extra = [a for k, v in opts.items() for a in ("-o", f"nvidia.{k}={v}")]
    async with dra_node() as (runner, kubelet):
        proc = spawn(runner, hetero_dp_cmd, cli_env, *extra, backend="nvidia", env=env)
        try:
            spec, name = await claim_spec(
                runner, kubelet, "gpu.nvidia.com", fake.uuid(2), workdir / "spec"
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            code, log = await wait_exit(proc, 30)
        assert code == 0, log
    await asyncio.to_thread(sees_the_gpu, runtime_cdi, spec, name, "void", calls)
