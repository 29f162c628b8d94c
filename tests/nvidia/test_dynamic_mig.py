"""Dynamic MIG (DRA mode's ``dynamicMig``) through real pynvml against the fake driver:
the placements, making and removing instances, and each way NVML can refuse."""

from __future__ import annotations

import pynvml
import pytest
from hetero_dp_nvidia.backend import NvidiaBackend
from hetero_dp_nvidia.dynamic_mig import MigError

from hetero_dp import ConfigError

CLAIM = {"namespace": "default", "name": "c", "uid": "u-1"}


def started(node, **flags):
    b = NvidiaBackend(environ={})
    b.configure({**node.options, "dynamicMig": True, **flags})
    return b, b.discover()


def instances(gpu: int = 0) -> int:
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    n = 0
    for i in range(7):
        try:
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            n += 1
        except pynvml.NVMLError_NotFound:
            pass
    return n


def placement(parts, profile: str, start: int):
    return next(
        p
        for p in parts
        if p.attributes["migProfile"] == profile and p.attributes["migPlacementStart"] == start
    )


def test_only_gpus_in_mig_mode_get_counters_and_placements(fake_node):
    node = fake_node("a100-dynamic-mig.scn")
    b, devices = started(node)
    gpu0, gpu1 = devices
    assert gpu0.consumes == {f"memory-slice-{i}": 1 for i in range(8)}
    assert gpu1.consumes == {}
    parts = b.partitions(devices)
    assert {p.parent for p in parts} == {gpu0.id}
    one = placement(parts, "1g.10gb", 6)
    assert one.consumes == {"memory-slice-6": 1, "memory-slice-7": 1}
    assert one.resource == gpu0.resource and one.attributes["memoryMiB"] == 10240
    b.shutdown()


def test_dynamic_mig_needs_strategy_none(fake_node):
    node = fake_node("a100-dynamic-mig.scn")
    with pytest.raises(ConfigError, match="fix: set migStrategy to none") as e:
        NvidiaBackend(environ={}).configure(
            {**node.options, "dynamicMig": True, "migStrategy": "mixed"}
        )
    assert e.value.field == "dynamicMig"


def test_prepare_makes_one_instance_and_a_repeat_takes_it_over(fake_node):
    node = fake_node("a100-dynamic-mig.scn")
    b, devices = started(node, **{"plugin.passDeviceSpecs": True})
    part = placement(b.partitions(devices), "2g.10gb", 2)
    [rec] = b.prepare(CLAIM, [part], [])
    assert rec.id == part.id and rec.parent == devices[0].id
    mig_uuid = rec.attributes["uuid"]
    assert rec.env["NVIDIA_VISIBLE_DEVICES"] == mig_uuid and mig_uuid.startswith("MIG-")
    # the GPU's node and the instance's two capability nodes (mig-minors layout)
    gi = rec.attributes["gpuInstance"]
    paths = [n.container_path for n in rec.nodes]
    assert f"/dev/nvidia-caps/nvidia-cap{3 + 9 * gi}" in paths
    assert f"/dev/nvidia-caps/nvidia-cap{3 + 9 * gi + 1}" in paths
    [again] = b.prepare(CLAIM, [part], [])  # a prepare that crashed before its checkpoint
    assert again.attributes["uuid"] == mig_uuid and instances() == 1
    b.unprepare(CLAIM, [part.id])
    assert instances() == 0
    b.unprepare(CLAIM, [part.id])  # already gone: nothing to do, no error
    b.shutdown()


def test_without_permission_the_claim_fails_with_the_fix(fake_node):
    node = fake_node(
        "a100-dynamic-mig.scn", "fault fn=nvmlDeviceCreateGpuInstanceWithPlacement err=4"
    )
    b, devices = started(node)
    part = placement(b.partitions(devices), "1g.5gb", 3)
    with pytest.raises(MigError, match="permission denied; fix: run the plugin as root"):
        b.prepare(CLAIM, [part], [])
    b.shutdown()


def test_a_failed_compute_instance_leaves_no_gpu_instance_behind(fake_node):
    node = fake_node(
        "a100-dynamic-mig.scn", "fault fn=nvmlGpuInstanceCreateComputeInstance err=999"
    )
    b, devices = started(node)
    parts = b.partitions(devices)
    first, second = placement(parts, "1g.5gb", 0), placement(parts, "4g.20gb", 0)
    with pytest.raises(MigError, match=r"creating MIG 1g\.5gb at memory slice 0"):
        b.prepare(CLAIM, [first], [])
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    spot = pynvml.c_nvmlGpuInstancePlacement_t()
    spot.start, spot.size = 0, 4
    # slices 0-3 are free again: a GPU instance can be made there by hand
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 5, pynvml.byref(spot))
    pynvml.nvmlGpuInstanceDestroy(gi)
    assert second.attributes["migPlacementSize"] == 4
    b.shutdown()


def test_a_claim_of_two_placements_is_made_whole_or_not_at_all(fake_node):
    node = fake_node("a100-dynamic-mig.scn")
    b, devices = started(node)
    parts = b.partitions(devices)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    spot = pynvml.c_nvmlGpuInstancePlacement_t()
    spot.start, spot.size = 6, 1
    in_the_way = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, pynvml.byref(spot))
    with pytest.raises(MigError, match="taken by an instance this driver did not make"):
        b.prepare(CLAIM, [placement(parts, "1g.5gb", 0), placement(parts, "1g.10gb", 6)], [])
    assert instances() == 0  # the 1g.5gb made first was destroyed again
    pynvml.nvmlGpuInstanceDestroy(in_the_way)
    b.shutdown()


def test_an_instance_still_in_use_fails_the_unprepare_for_a_retry(fake_node):
    node = fake_node("a100-dynamic-mig.scn", "fault fn=nvmlGpuInstanceDestroy err=19 times=1")
    b, devices = started(node)
    part = placement(b.partitions(devices), "3g.20gb", 0)
    b.prepare(CLAIM, [part], [])
    with pytest.raises(MigError, match="processes still use it"):
        b.unprepare(CLAIM, [part.id])
    b.unprepare(CLAIM, [part.id])  # the kubelet's retry
    assert instances() == 0
    b.shutdown()


def test_without_dynamic_mig_the_hooks_do_nothing(fake_node):
    node = fake_node("a100-dynamic-mig.scn")
    b = NvidiaBackend(environ={})
    b.configure(node.options)
    devices = b.discover()
    assert all(not d.consumes for d in devices)
    assert b.partitions(devices) == []
    assert b.prepare(CLAIM, devices, []) is None
    b.shutdown()
