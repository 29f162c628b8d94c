"""CDI specs consumed by a real runtime: podman reads specs from /etc/cdi and
/var/run/cdi and, for ``podman run --device vendor.com/class=name``, injects the
device's nodes, env and mounts and runs its hooks (podman-run(1), ``--device``; the
CDI spec, github.com/cncf-tags/container-device-interface SPEC.md).

Each test writes the spec as the plugin does, copies it into /var/run/cdi under a name
of its own (removed afterwards), starts a short-lived container with the CDI name the
plugin answered in Allocate, and checks from inside what the container got. Device
nodes must be real: the fake ones are character devices made with mknod (a GPU's
195:<minor>, as NVIDIA's driver numbers them; generic ones 1:3, the numbers of
/dev/null), so the runtime can create them in the container.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hetero_dp import Device, DeviceNode, Mount, hookimpl
from tests.nvidia.driver_root import VERSION, build_ld_cache, make_driver_root

from .conftest import KubeletThread, free_port
from .test_nvidia_pods import CHART, check_serves_and_stops, render, start_pod

SPEC_DIR = Path("/var/run/cdi")


@pytest.fixture
def runtime_cdi(engine) -> Iterator[Any]:
    """``consume(spec_path, name, script)`` -> the container's output: copies the spec
    into /var/run/cdi for the run, starts ``sh -c script`` with ``--device name``."""
    copied: list[Path] = []
    base = None

    def consume(spec: Path, name: str, script: str) -> subprocess.CompletedProcess[str]:
        nonlocal base
        if base is None:
            import build_images

            base = build_images.base_image(engine)
        SPEC_DIR.mkdir(parents=True, exist_ok=True)
        target = SPEC_DIR / f"hetero-dp-deploytest-{uuid.uuid4().hex[:8]}.json"
        shutil.copy(spec, target)
        copied.append(target)
        return subprocess.run(
            [*engine.cmd("run", "--rm"), *engine.run_flags, "--network", "none",
             "--pull", "never", "--device", name, base, "sh", "-c", script],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    yield consume
    for path in copied:
        path.unlink(missing_ok=True)


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


async def test_a_generic_backends_spec_gives_the_container_its_node_env_and_mount(
    fake_kubelet, plugin_runner, tmp_path, runtime_cdi
):
    root = tmp_path / "host"
    for i in range(2):
        mknod(root / f"dev/accel{i}", 1, 3)
    (root / "opt/acme").mkdir(parents=True)
    (root / "opt/acme/driver.txt").write_text("acme driver 2.1\n")
    cdi_dir = tmp_path / "cdi"
    await plugin_runner.start(
        Accel(root),
        config={
            "cdi": {"enabled": True, "dir": str(cdi_dir)},
            "resources": {"acme.com/accel": {"deliver": ["cdi-cri"]}},
        },
    )
    await fake_kubelet.wait_devices("acme.com/accel", lambda d: len(d) == 2)
    r = await fake_kubelet.allocate("acme.com/accel", ["accel1"])
    [name] = [c.name for c in r.cdi_devices]
    [spec] = cdi_dir.glob("*.json")
    out = runtime_cdi(
        spec,
        name,
        'stat -c "%F %t:%T" /dev/accel1; echo "driver=$ACME_DRIVER"; cat /opt/acme/driver.txt',
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "character special file 1:3",
        "driver=2.1",
        "acme driver 2.1",
    ]


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
    driver = fake.root / "driver"
    make_driver_root(driver)
    build_ld_cache(driver)
    for g in fake.gpus:
        mknod(driver / f"dev/nvidia{g.get('minor', '0')}", 195, int(g.get("minor", "0")))
    mknod(driver / "dev/nvidiactl", 195, 255)
    mknod(driver / "dev/nvidia-uvm", 510, 0)
    mknod(driver / "dev/nvidia-uvm-tools", 510, 1)
    calls = workdir / "nvidia-ctk-calls"
    ctk = driver / "usr/bin/nvidia-ctk"
    ctk.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    ctk.chmod(0o755)
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
    spec = json.loads(spec_path.read_text())
    device = next(d for d in spec["devices"] if name.endswith("=" + d["name"]))
    [gpu_node] = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    out = runtime_cdi(
        spec_path,
        name,
        f'stat -c "%F %t:%T %n" {gpu_node} /dev/nvidiactl; echo "visible=$NVIDIA_VISIBLE_DEVICES"; '
        f"ls /usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    minor = int(gpu_node.removeprefix("/dev/nvidia"))
    assert lines[0] == f"character special file c3:{minor:x} {gpu_node}"
    assert lines[1] == "character special file c3:ff /dev/nvidiactl"
    assert lines[2] == "visible=void"
    assert lines[3] == f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    recorded = calls.read_text().splitlines()
    assert any(c.startswith("hook update-ldcache") for c in recorded), recorded
    assert any(c.startswith("hook create-symlinks") for c in recorded), recorded


async def test_a_dra_claims_spec_gives_the_container_its_node_and_env(tmp_path, runtime_cdi):
    """DRA mode: the per-claim spec NodePrepareResources writes starts a container with
    the claimed device's node and env."""
    pytest.importorskip("kubernetes")  # DRA mode's optional dependency
    from hetero_dp.dra import device_name
    from hetero_dp.testing import short_tempdir
    from hetero_dp.testing.dra import ClaimRef, DRARunner, FakeAPIServer, FakeDRAKubelet, make_claim

    driver = "accel.acme.com"  # the default driver name of acme.com/accel
    host = tmp_path / "host"
    for i in range(2):
        mknod(host / f"dev/accel{i}", 1, 3)
    (host / "opt/acme").mkdir(parents=True)
    (host / "opt/acme/driver.txt").write_text("acme driver 2.1\n")
    root = short_tempdir("hdep-")
    with FakeAPIServer() as api:
        runner = DRARunner(root, api)
        kubelet = FakeDRAKubelet(runner.registry_dir)
        await kubelet.start()
        try:
            await runner.start(Accel(host))
            await kubelet.wait_registered(driver)
            claim = make_claim(
                "c1", [("accel", device_name("accel1"))], driver=driver, pool="node-a"
            )
            ref = ClaimRef.of(api.add_claim(claim))
            entry = (await kubelet.node_prepare(driver, [ref])).claims[ref.uid]
            assert entry.error == ""
            [name] = [i for d in entry.devices for i in d.cdi_device_ids]
            [spec] = runner.cdi_dir.glob("*.json")
            out = runtime_cdi(
                spec,
                name,
                'stat -c "%F %t:%T" /dev/accel1; echo "visible=$ACME_VISIBLE_DEVICES"; '
                "cat /opt/acme/driver.txt",
            )
        finally:
            await runner.stop_all()
            await kubelet.stop()
            shutil.rmtree(root, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "character special file 1:3",
        "visible=1",
        "acme driver 2.1",
    ]
