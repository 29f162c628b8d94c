"""Pair scores from NVLink/PCIe, GPU feature discovery labels, DCGM-named metrics, doctor."""

from __future__ import annotations

import sys

import pluggy
import pytest
from hetero_dp_nvidia import backend as backend_module
from hetero_dp_nvidia.backend import NvidiaBackend

import hetero_dp.hookspecs
from hetero_dp import Device


def started(node, env=None, **flags):
    b = NvidiaBackend(environ=env or {})
    b.configure({**node.options, **flags})
    return b, b.discover()


def scores(links):
    return {frozenset((link.a, link.b)): (link.score, link.kind) for link in links}


def test_links_nvlink_and_pcie_weights(fake_node):
    node = fake_node("a100-8x-nvlink.scn")
    b, devices = started(node)
    got = scores(b.links(devices))
    u = node.uuid
    assert len(got) == 28  # every pair of 8 GPUs
    assert got[frozenset((u(0), u(1)))] == (4 * 100 + 50, "NV4")  # 4 links + single switch
    assert got[frozenset((u(0), u(2)))] == (2 * 100 + 30, "NV2")  # 2 links + host bridge
    assert got[frozenset((u(0), u(4)))] == (2 * 100 + 10, "NV2")  # 2 links + across CPUs
    assert got[frozenset((u(0), u(3)))] == (30, "PHB")
    assert got[frozenset((u(1), u(6)))] == (10, "SYS")
    b.shutdown()


def test_links_pcie_only_and_board_levels(fake_node):
    node = fake_node(
        "",
        'gpu uuid=GPU-a name="Tesla K80" pci=00000000:05:00.0 board=7',
        'gpu uuid=GPU-b name="Tesla K80" pci=00000000:06:00.0 board=7',
        'gpu uuid=GPU-c name="Tesla K80" pci=00000000:85:00.0 board=8',
        'gpu uuid=GPU-d name="Tesla K80" pci=00000000:86:00.0 board=9 numa=1',
        "topo a=2 b=3 level=20",
    )
    b, devices = started(node)
    got = scores(b.links(devices))
    assert got[frozenset(("GPU-a", "GPU-b"))] == (60, "BOARD")
    assert got[frozenset(("GPU-c", "GPU-d"))] == (40, "PXB")
    assert got[frozenset(("GPU-a", "GPU-c"))] == (20, "NODE")
    assert got[frozenset(("GPU-a", "GPU-d"))] == (10, "SYS")
    b.shutdown()


def test_links_use_parents_of_mig_slices_and_are_cached(fake_node, fake_nvml_lib):
    node = fake_node("a100-8x-nvlink.scn")
    b, devices = started(node, {"MIG_STRATEGY": "mixed"})
    first = b.links(devices)
    assert node.uuid(0) in {x for link in first for x in (link.a, link.b)}
    calls = [fake_nvml_lib.fake_nvml_call_count(i) for i in range(8)]
    assert b.links(devices) == first
    assert [fake_nvml_lib.fake_nvml_call_count(i) for i in range(8)] == calls  # no NVML calls
    b.shutdown()


def test_labels_strategy_none(fake_node):
    node = fake_node("h100-8x.scn")
    b, devices = started(node)
    labels = b.labels(devices)
    b.shutdown()
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


def test_labels_mixed(fake_node):
    node = fake_node("a100-mig-mixed.scn")
    b, devices = started(node, {"MIG_STRATEGY": "mixed"})
    labels = b.labels(devices)
    b.shutdown()
    assert labels["nvidia.com/gpu.count"] == "1"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "8"
    assert labels["nvidia.com/mig-1g.10gb.memory"] == "9856"
    assert labels["nvidia.com/mig-3g.40gb.count"] == "2"
    assert labels["nvidia.com/mig-2c.4g.40gb.count"] == "1"


def test_labels_single(fake_node):
    node = fake_node("a100-mig-single.scn")
    b, devices = started(node, {"MIG_STRATEGY": "single"})
    labels = b.labels(devices)
    b.shutdown()
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert labels["nvidia.com/gpu.memory"] == "19968"


def test_labels_with_time_slicing_replicas(fake_node):
    node = fake_node("v100-2x-pcie.scn")
    b, devices = started(node)
    replicas = [
        Device(id=f"{d.id}::{n}", resource=d.resource, attributes=d.attributes)
        for d in devices
        for n in range(4)
    ]
    labels = b.labels(replicas)
    b.shutdown()
    assert labels["nvidia.com/gpu.product"] == "Tesla-V100-PCIE-16GB-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig.capable"] == "false"


def test_metrics_per_gpu_with_dcgm_names(fake_node, fake_nvml_lib):
    node = fake_node("h100-8x.scn")
    b, devices = started(node)
    fake_nvml_lib.fake_nvml_set_value(2, b"temp", 81)
    fake_nvml_lib.fake_nvml_set_value(2, b"power", 412500)
    samples = b.metrics(devices)
    b.shutdown()
    gpu2 = {s.name: s.value for s in samples if s.labels["UUID"] == node.uuid(2)}
    assert gpu2["DCGM_FI_DEV_GPU_TEMP"] == 81
    assert gpu2["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(412.5)
    assert gpu2["DCGM_FI_DEV_FB_USED"] + gpu2["DCGM_FI_DEV_FB_FREE"] == 81559
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"} <= gpu2.keys()
    # each sample says which device it measures (the framework adds its holder's labels)
    assert {s.device_id for s in samples if s.labels["UUID"] == node.uuid(2)} == {node.uuid(2)}


def test_mig_memory_samples_name_their_mig_device(fake_node):
    node = fake_node("a100-mig-mixed.scn")
    b, devices = started(node, migStrategy="mixed")
    samples = b.metrics(devices)
    b.shutdown()
    mig = [s for s in samples if "MIG_UUID" in s.labels]
    assert mig and all(s.device_id == s.labels["MIG_UUID"] for s in mig)
    assert {s.device_id for s in mig} == set(
        node.mig_uuids(0) + node.mig_uuids(1) + node.mig_uuids(2)
    )


def test_doctor_passes_on_a_healthy_node(fake_node):
    node = fake_node("a100-8x-nvlink.scn")
    checks = NvidiaBackend(environ={}).doctor(node.options)
    assert [c.status for c in checks] == ["pass"] * len(checks)
    assert {c.name for c in checks} >= {"nvml", "nvidia driver", "nvidia gpus", "mig layout"}


def test_doctor_names_version_mismatch(fake_node):
    node = fake_node("h100-8x.scn", "init_error 18")
    [check] = NvidiaBackend(environ={}).doctor(node.options)
    assert check.name == "nvidia driver/library version" and check.status == "fail"
    assert "version mismatch" in check.message
    assert check.fix == "reload the nvidia kernel module or reboot the node"


def test_doctor_flags_lost_gpu_missing_nodes_and_bad_layout(fake_node):
    node = fake_node("a100-8x-nvlink.scn", control_nodes=())
    node.lib.fake_nvml_reset()
    text = node.scenario.read_text().replace(
        f"uuid={node.uuid(2)}", f"uuid={node.uuid(2)} lost_after=1"
    )
    node.scenario.write_text(text)
    checks = {
        c.name: c
        for c in NvidiaBackend(environ={}).doctor({**node.options, "migStrategy": "single"})
    }
    assert checks["gpu 2"].status == "fail" and "is lost" in checks["gpu 2"].message
    assert "nvidia-smi -r" in checks["gpu 2"].fix
    assert checks["nvidia device nodes"].status == "warn"
    assert checks["mig layout"].status == "fail" and "mixed" in checks["mig layout"].fix


def test_doctor_rejects_bad_options():
    [check] = NvidiaBackend(environ={}).doctor({"migStrategy": "sometimes"})
    assert check.status == "fail" and "migStrategy" in check.message


def test_hookimpls_match_the_contract():
    pm = pluggy.PluginManager("hetero_dp")
    pm.add_hookspecs(hetero_dp.hookspecs)
    pm.register(backend_module.plugin, name="nvidia")  # validates names and arguments
    pm.check_pending()
    implemented = {h.name for h in pm.get_hookcallers(backend_module.plugin)}
    assert implemented == {
        "partitions",
        "prepare",
        "unprepare",
        "cdi_spec_edits",
        "parse_args",
        "allocate",
        "allocate_key",
        "configure",
        "discover",
        "check_health",
        "watch",
        "links",
        "labels",
        "metrics",
        "usage",
        "resource_defaults",
        "doctor",
        "shutdown",
        "config_sections",
        "runtime_advice",
    }
    other = NvidiaBackend(environ={})
    pm.register(other, name="nvidia-instance")
    pm.check_pending()


def test_links_through_nvswitches(fake_node):
    node = fake_node(
        "",
        'gpu uuid=GPU-a name="NVIDIA H200" pci=00000000:19:00.0 nvlinks=18 switchlinks=18',
        'gpu uuid=GPU-b name="NVIDIA H200" pci=00000000:3B:00.0 nvlinks=18 switchlinks=18',
        'gpu uuid=GPU-c name="NVIDIA H200" pci=00000000:4C:00.0 numa=1',
    )
    b, devices = started(node)
    got = scores(b.links(devices))
    b.shutdown()
    # 18 links each through the switches, plus the PCIe path (same CPU)
    assert got[frozenset(("GPU-a", "GPU-b"))] == (18 * 100 + 20, "NV18")
    assert got[frozenset(("GPU-a", "GPU-c"))] == (10, "SYS")


def test_entry_point_names_the_backend_instance():
    import importlib
    from pathlib import Path

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # tomli is hetero-dp's own dependency on 3.10
        import tomli as tomllib

    pyproject = Path(__file__).resolve().parents[2] / "vendors/nvidia/pyproject.toml"
    meta = tomllib.loads(pyproject.read_text())["project"]
    assert meta["name"] == "hetero-dp-nvidia"
    target = meta["entry-points"]["hetero_dp"]["nvidia"]
    module, _, attr = target.partition(":")
    instance = getattr(importlib.import_module(module), attr)
    assert instance is backend_module.plugin and isinstance(instance, NvidiaBackend)
    assert instance.hetero_dp_name == "nvidia"
    # a module-level hookimpl beside the instance would be a second registration style
    assert not [
        n for n in dir(backend_module) if hasattr(getattr(backend_module, n), "hetero_dp_impl")
    ]
