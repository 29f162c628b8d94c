"""Device lists per MIG strategy, read through real pynvml from the fake driver."""

from __future__ import annotations

import pytest
from hetero_dp_nvidia.backend import NvidiaBackend

from hetero_dp import ConfigError


def backend(node, env=None, **flags):
    b = NvidiaBackend(environ=env or {})
    b.configure({**node.options, **flags})
    return b


def by_resource(devices):
    out = {}
    for d in devices:
        out.setdefault(d.resource, []).append(d.id)
    return out


def test_strategy_none_lists_every_gpu_whole(fake_node):
    node = fake_node("a100-8x-nvlink.scn")
    b = backend(node, migStrategy="none")
    devices = b.discover()
    assert by_resource(devices) == {"nvidia.com/gpu": [g["uuid"] for g in node.gpus]}
    assert all(d.parent is None for d in devices)
    b.shutdown()


def test_strategy_mixed_lists_mig_profiles_and_whole_gpus(fake_node):
    node = fake_node("a100-8x-nvlink.scn")
    b = backend(node, migStrategy="mixed")
    got = by_resource(b.discover())
    migs = node.mig_uuids(0)
    assert got == {
        "nvidia.com/mig-1g.5gb": migs[:2],
        "nvidia.com/mig-2g.10gb": [migs[2]],
        "nvidia.com/mig-3g.20gb": [migs[3]],
        "nvidia.com/gpu": [g["uuid"] for g in node.gpus[1:]],
    }
    b.shutdown()


def test_mixed_node_profiles_including_compute_instance_slice(fake_node):
    node = fake_node("a100-mig-mixed.scn")
    b = backend(node, migStrategy="mixed")
    devices = b.discover()
    got = {k: len(v) for k, v in by_resource(devices).items()}
    assert got == {
        "nvidia.com/mig-1g.10gb": 8,
        "nvidia.com/mig-3g.40gb": 2,
        "nvidia.com/mig-2g.20gb": 1,
        "nvidia.com/mig-2c.4g.40gb": 1,
        "nvidia.com/gpu": 1,
    }
    slices = [d for d in devices if d.parent == node.uuid(1)]
    assert [d.attributes["migProfile"] for d in slices] == ["3g.40gb", "3g.40gb"]
    assert all(d.attributes["memoryMiB"] == 40192 for d in slices)
    b.shutdown()


def test_strategy_single_advertises_slices_as_gpus(fake_node):
    node = fake_node("a100-mig-single.scn")
    b = backend(node, migStrategy="single")
    devices = b.discover()
    assert by_resource(devices) == {"nvidia.com/gpu": node.mig_uuids(0) + node.mig_uuids(1)}
    assert {d.parent for d in devices} == {node.uuid(0), node.uuid(1)}
    b.shutdown()


def test_strategy_single_without_mig_falls_back_to_whole_gpus(fake_node):
    node = fake_node("h100-8x.scn")
    b = backend(node, migStrategy="single")
    assert len(by_resource(b.discover())["nvidia.com/gpu"]) == 8
    b.shutdown()


def test_strategy_single_rejects_a_layout_that_does_not_fit(fake_node):
    node = fake_node("a100-8x-nvlink.scn")  # GPU 0 in MIG mode, GPUs 1-7 not
    b = NvidiaBackend(environ={"MIG_STRATEGY": "single"})
    with pytest.raises(ConfigError) as info:
        b.configure(node.options)
    msg = str(info.value)
    assert info.value.field == "migStrategy"
    assert "GPUs 0 are in MIG mode and GPUs 1, 2, 3, 4, 5, 6, 7 are not" in msg
    assert "migStrategy to mixed" in msg
    b.shutdown()


def test_strategy_single_rejects_mixed_profiles(fake_node):
    node = fake_node(
        "",
        'gpu uuid=GPU-a name="NVIDIA A100-SXM4-40GB" mem=40960 cc=8.0 pci=00000000:07:00.0 mig=1',
        'gpu uuid=GPU-b name="NVIDIA A100-SXM4-40GB" mem=40960 cc=8.0 pci=00000000:0F:00.0 mig=1',
        "mig gpu=0 uuid=MIG-a0 gi=7 ci=0 slices=1 mem=4864 gicap=1 cicap=2",
        "mig gpu=1 uuid=MIG-b0 gi=1 ci=0 slices=7 mem=40192 gicap=3 cicap=4",
    )
    b = NvidiaBackend(environ={"MIG_STRATEGY": "single"})
    with pytest.raises(ConfigError) as info:
        b.configure(node.options)
    assert "one MIG profile on the node, found 1g.5gb on 0:0; 7g.40gb on 1:0" in str(info.value)
    b.shutdown()


def test_strategy_single_rejects_mig_mode_without_mig_devices(fake_node):
    node = fake_node(
        "",
        'gpu uuid=GPU-a name="NVIDIA A100-SXM4-40GB" mem=40960 cc=8.0 pci=00000000:07:00.0 mig=1',
    )
    b = NvidiaBackend(environ={"MIG_STRATEGY": "single"})
    with pytest.raises(ConfigError, match="GPUs 0 are in MIG mode but have no MIG devices"):
        b.configure(node.options)
    b.shutdown()


def test_gpu_attributes_numa_and_index(fake_node):
    node = fake_node("a100-8x-nvlink.scn")
    b = backend(node)
    d5 = b.discover()[5]
    assert d5.numa_nodes == (1,)
    assert d5.index == 5
    assert d5.attributes == {
        "uuid": node.uuid(5),
        "productName": "NVIDIA A100-SXM4-40GB",
        "architecture": "ampere",
        "cudaComputeCapability": "8.0",
        "pcieBusID": "0000:90:00.0",
        "driverVersion": "550.54.15",
        "cudaDriverVersion": "12.4",
        "index": 5,
        "minor": 5,
        "memoryMiB": 40960,
        "migEnabled": False,
    }
    b.shutdown()


def test_numa_missing_in_sysfs_means_no_affinity(fake_node):
    node = fake_node("v100-2x-pcie.scn")
    (node.root / "sys/bus/pci/devices/0000:87:00.0/numa_node").write_text("-1\n")
    b = backend(node)
    devices = b.discover()
    assert [d.numa_nodes for d in devices] == [(0,), ()]
    b.shutdown()


def test_discovery_is_repeatable_and_sees_changes(fake_node):
    node = fake_node("h100-8x.scn")
    b = backend(node)
    first = b.discover()
    assert b.discover() == first
    b.shutdown()


def test_a_refused_reconfigure_leaves_the_old_options_in_force(fake_node):
    node = fake_node("a100-8x-nvlink.scn")  # GPU 0 in MIG mode, GPUs 1-7 not
    b = backend(node, migStrategy="mixed")
    with pytest.raises(ConfigError):
        b.configure({**node.options, "migStrategy": "single"})
    assert b.options.mig_strategy == "mixed"
    assert "nvidia.com/mig-1g.5gb" in by_resource(b.discover())
    b.shutdown()


MEDIA_MIG = (
    # A 1g.5gb+me GPU instance (profile ID 20 on an A100-40GB, fake_nvml.c's table)
    "mig gpu=0 uuid=MIG-5e1d1a00-0000-4000-8000-00000000e001 gi=9 ci=0 slices=1 mem=4864 "
    "profile=20 gicap=109 cicap=336"
)


def test_mig_profile_attributes_are_derived_like_nvidias(fake_node):
    node = fake_node("a100-8x-nvlink.scn", MEDIA_MIG)
    b = backend(node, migStrategy="mixed")
    devices = b.discover()
    media = next(d for d in devices if d.id.startswith("MIG-5e1d1a00"))
    assert media.resource == "nvidia.com/mig-1g.5gb.me"  # '+' becomes '.', as NVIDIA's
    assert media.attributes["migProfile"] == "1g.5gb+me"
    plain = by_resource(devices)["nvidia.com/mig-1g.5gb"]
    assert plain == node.mig_uuids(0)[:2]  # profile 19: no attribute
    b.shutdown()


def test_nvidia_resources_section_renames_gpus_and_mig_profiles(fake_node):
    node = fake_node("a100-8x-nvlink.scn", MEDIA_MIG)
    renames = {
        "gpus": [{"pattern": "*V100*", "name": "v100"}, {"pattern": "*A100*", "name": "a100"}],
        "mig": [{"pattern": "1g.5gb+me", "name": "nvidia.com/mig-media"}],
    }
    b = backend(node, migStrategy="mixed", resources=renames)
    got = by_resource(b.discover())
    assert got["nvidia.com/a100"] == [g["uuid"] for g in node.gpus[1:]]
    assert got["nvidia.com/mig-media"] == ["MIG-5e1d1a00-0000-4000-8000-00000000e001"]
    assert got["nvidia.com/mig-1g.5gb"] == node.mig_uuids(0)[:2]  # no match: default name
    assert "nvidia.com/gpu" not in got
    b.shutdown()
