"""The NVIDIA backend through the operations side: GPU feature discovery labels in the
NFD file, DCGM-named samples on /metrics, and its driver checks first in ``doctor``.

Runs the real backend against the fake libnvidia-ml.so.1 (fixtures ``fake_node`` and
``fake_nvml_lib`` from tests/fakenvml/fixtures.py, loaded by tests/conftest.py for every
directory, so this file runs alone or in any order; skipped where the backend is absent)."""

from __future__ import annotations

import asyncio
import shutil

import pytest

pytest.importorskip("hetero_dp_nvidia")

from hetero_dp_nvidia.backend import NvidiaBackend

from hetero_dp.engine.config import load_config
from hetero_dp.ops.doctor import DoctorSettings, exit_code, run_doctor
from hetero_dp.ops.labels import parse
from hetero_dp.testing import short_tempdir

from .helpers import scrape, value

GPU = "nvidia.com/gpu"


@pytest.fixture
def label_dir():
    d = short_tempdir("hdp-nvl-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_gfd_labels_and_dcgm_metrics_from_a_running_daemon(
    fake_kubelet, plugin_runner, fake_node, label_dir
):
    node = fake_node("h100-8x.scn")
    daemon = await plugin_runner.start(
        NvidiaBackend(environ={}),
        config={
            "labels": {"enabled": True, "dir": str(label_dir)},
            "metrics": {"address": "127.0.0.1:0"},
        },
        options={"nvidia": node.options},
    )
    await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 8)
    labels = parse((label_dir / "hetero-dp-nvidia").read_text())
    assert labels == {
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "none",
        "nvidia.com/mps.capable": "false",
    }
    m = await scrape(daemon)
    assert value(m, "hetero_dp_devices", resource=GPU) == 8
    temps = [v for (name, _), v in m.items() if name == "DCGM_FI_DEV_GPU_TEMP"]
    assert len(temps) == 8


async def test_mig_mixed_labels(fake_kubelet, plugin_runner, fake_node, label_dir):
    node = fake_node("a100-mig-mixed.scn")
    await plugin_runner.start(
        NvidiaBackend(environ={}),
        config={"labels": {"enabled": True, "dir": str(label_dir)}},
        options={"nvidia": {**node.options, "migStrategy": "mixed"}},
    )
    await fake_kubelet.wait_registered("nvidia.com/mig-1g.10gb")
    labels = parse((label_dir / "hetero-dp-nvidia").read_text())
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "8"
    assert labels["nvidia.com/mig-1g.10gb.memory"] == "9856"
    assert labels["nvidia.com/mig-3g.40gb.count"] == "2"
    assert labels["nvidia.com/gpu.count"] == "1"


@pytest.mark.parametrize(
    ("init_error", "name", "message", "fix"),
    [
        (18, "nvidia driver/library version", "version mismatch", "reboot"),
        (9, "nvml", "kernel driver is not loaded", "modprobe nvidia"),
    ],
)
def test_doctor_puts_the_driver_first(fake_node, init_error, name, message, fix):
    node = fake_node("h100-8x.scn", f"init_error {init_error}")
    root = short_tempdir("hdp-nvd-")
    try:
        cfg = load_config(raw={"backends": {"nvidia": node.options}}, env={})
        findings = asyncio.run(
            run_doctor(cfg, _load(NvidiaBackend(environ={})), DoctorSettings(root=root))
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    first = next(f for f in findings if f.status == "fail")
    assert (first.step, first.name) == ("driver", f"nvidia: {name}")
    assert message in first.message and fix in first.fix
    assert exit_code(findings) == 1


def _load(backend):
    from hetero_dp.engine.loading import load_backends

    return load_backends([backend])


async def test_reload_of_device_list_strategy_restarts_the_gpu_resource_with_cdi(
    fake_kubelet, plugin_runner, fake_node, label_dir
):
    node = fake_node("h100-8x.scn")
    doc = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "pluginsRegistryDir": str(fake_kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "cdi": {"enabled": True, "dir": str(label_dir / "cdi")},
        "flags": {**node.options, "plugin": {"deviceListStrategy": "envvar"}},
    }
    daemon = await plugin_runner.start(NvidiaBackend(environ={}), config=doc)
    await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 8)
    first = await fake_kubelet.allocate(GPU, [node.uuid(0)])
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == node.uuid(0) and not first.cdi_devices

    doc["flags"] = {**node.options, "plugin": {"deviceListStrategy": "cdi-cri"}}
    summary = await daemon.apply_config(load_config(raw=doc, env={}))
    assert summary == {"restarted": [GPU], "reconfigured": ["nvidia"]}
    await fake_kubelet.wait_registered(GPU, after=1)
    resp = await fake_kubelet.allocate(GPU, [node.uuid(1)])
    assert [c.name for c in resp.cdi_devices] == [
        f"k8s.device-plugin.nvidia.com/gpu={node.uuid(1)}"
    ]
    assert "NVIDIA_VISIBLE_DEVICES" not in resp.envs
    assert list((label_dir / "cdi").iterdir())  # the spec the runtime needs is there


@pytest.mark.parametrize(
    ("entry", "resource", "product"),
    [
        ({"name": "nvidia.com/gpu", "replicas": 4}, GPU, "Tesla-V100-PCIE-16GB-SHARED"),
        (
            {"name": "nvidia.com/gpu", "replicas": 4, "rename": "gpu.shared"},
            "nvidia.com/gpu.shared",
            "Tesla-V100-PCIE-16GB",  # renamed: GFD adds no -SHARED
        ),
    ],
)
async def test_time_slicing_labels(
    fake_kubelet, plugin_runner, fake_node, label_dir, entry, resource, product
):
    node = fake_node("v100-2x-pcie.scn")
    await plugin_runner.start(
        NvidiaBackend(environ={}),
        config={
            "labels": {"enabled": True, "dir": str(label_dir)},
            "sharing": {"timeSlicing": {"resources": [entry]}},
        },
        options={"nvidia": node.options},
    )
    await fake_kubelet.wait_devices(resource, lambda d: len(d) == 8)
    labels = parse((label_dir / "hetero-dp-nvidia").read_text())
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"] == product


@pytest.mark.parametrize(
    ("strategy", "containerd", "status", "message"),
    [
        ("envvar", "version = 2\n", "fail", "no nvidia runtime and no CDI delivery"),
        (
            "cdi-cri",
            "version = 2\n",
            "fail",
            "CDI delivery is configured but containerd has CDI off",
        ),
        (
            "cdi-cri",
            'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n',
            "pass",
            "CDI delivery",  # CDI alone: no nvidia runtime needed
        ),
    ],
)
def test_doctor_runtime_check_follows_the_device_list_strategy(
    fake_node, strategy, containerd, status, message
):
    node = fake_node("h100-8x.scn")
    root = short_tempdir("hdp-nvr-")
    try:
        (root / "etc/containerd").mkdir(parents=True)
        (root / "etc/containerd/config.toml").write_text(containerd)
        raw = {"flags": {**node.options, "plugin": {"deviceListStrategy": strategy}}}
        findings = asyncio.run(
            run_doctor(
                load_config(raw=raw, env={}),
                _load(NvidiaBackend(environ={})),
                DoctorSettings(root=root),
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    [runtime] = [f for f in findings if f.step == "runtime"]
    assert runtime.status == status, runtime
    assert message in runtime.message
    assert [f.status for f in findings if f.step == "devices"] == ["pass"]
