"""Sharing config parsing, advertising replicas, mapping back, request rules."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from hetero_dp import AllocationError, ConfigError, Device
from hetero_dp.allocation.sharing import (
    SharingConfig,
    advertise,
    advertised_resources,
    is_replica,
    parse_replica_policy,
    parse_sharing,
    physical_id,
    replica_number,
    to_physical,
    validate_sharing,
)

GPU = "nvidia.com/gpu"

# NVIDIA's documented time-slicing example, verbatim in shape.
NVIDIA_CONFIG = """
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""


def gpus(n: int, resource: str = GPU) -> list[Device]:
    return [
        Device(f"GPU-{i}", resource, index=i, numa_nodes=(0,), env={"X": str(i)}) for i in range(n)
    ]


def ts(*resources: dict[str, Any], **flags: Any) -> dict[str, Any]:
    return {"timeSlicing": {**flags, "resources": list(resources)}}


def test_nvidia_config_parses_unchanged() -> None:
    raw = yaml.safe_load(NVIDIA_CONFIG)
    config = parse_sharing(raw["sharing"], "config.yaml")
    assert config.enabled and not config.rename_by_default
    assert not config.fail_requests_greater_than_one
    (entry,) = config.resources
    assert (entry.name, entry.replicas, entry.rename, entry.devices.all) == (GPU, 10, "", True)
    advertised = advertise(gpus(2), config)
    assert len(advertised) == 20
    assert [d.id for d in advertised[:3]] == ["GPU-0::0", "GPU-0::1", "GPU-0::2"]
    assert {d.resource for d in advertised} == {GPU}


def test_replicas_copy_every_other_field() -> None:
    (phys,) = gpus(1)
    config = parse_sharing(ts({"name": GPU, "replicas": 2}))
    for n, rep in enumerate(advertise([phys.with_health(False, "XID 79")], config)):
        assert rep.id == f"GPU-0::{n}"
        assert not rep.healthy and rep.reason == "XID 79"
        assert (rep.env, rep.numa_nodes, rep.index) == (phys.env, phys.numa_nodes, phys.index)


def test_rename_by_default_and_explicit_renames() -> None:
    config = parse_sharing(ts({"name": GPU, "replicas": 2}, renameByDefault=True))
    assert advertised_resources(gpus(1), config) == ["nvidia.com/gpu.shared"]
    bare = parse_sharing(ts({"name": "gpu", "replicas": 2, "rename": "gpu-ts"}))
    assert advertised_resources(gpus(1), bare) == ["nvidia.com/gpu-ts"]
    full = parse_sharing(ts({"name": GPU, "replicas": 2, "rename": "acme.io/slices"}))
    assert advertised_resources(gpus(1), full) == ["acme.io/slices"]
    # An explicit rename wins over renameByDefault.
    both = parse_sharing(ts({"name": GPU, "replicas": 2, "rename": "x"}, renameByDefault=True))
    assert both.shared_name(GPU) == "nvidia.com/x"


def test_bare_name_matches_any_vendor_prefix_and_full_name_wins() -> None:
    config = parse_sharing(
        ts({"name": "gpu", "replicas": 2}, {"name": "amd.com/gpu", "replicas": 3})
    )
    assert config.replicas_for(GPU) == 2
    assert config.replicas_for("amd.com/gpu") == 3
    assert config.replicas_for("example.com/fpga") == 1


@pytest.mark.parametrize(
    ("devices", "shared"),
    [
        ("all", ["GPU-0", "GPU-1", "GPU-2"]),
        (2, ["GPU-0", "GPU-1"]),
        ([2], ["GPU-2"]),
        (["2"], ["GPU-2"]),
        (["GPU-1", 0], ["GPU-0", "GPU-1"]),
    ],
)
def test_per_device_selection(devices: Any, shared: list[str]) -> None:
    config = parse_sharing(
        ts({"name": GPU, "replicas": 2, "devices": devices}, renameByDefault=True)
    )
    physical = gpus(3)
    validate_sharing(config, physical)
    advertised = advertise(physical, config)
    assert to_physical([d.id for d in advertised if is_replica(d.id)]) == shared
    whole = [d for d in advertised if not is_replica(d.id)]
    assert [d.id for d in whole] == [d.id for d in physical if d.id not in shared]
    assert all(d.resource == GPU for d in whole)
    assert len(advertised) == 2 * len(shared) + len(whole)


def test_count_selection_follows_index_order() -> None:
    physical = [Device("b", GPU, index=1), Device("a", GPU, index=0), Device("c", GPU)]
    config = parse_sharing(ts({"name": GPU, "replicas": 2, "devices": 1}))
    assert [d.id for d in advertise(physical, config)] == ["b", "a::0", "a::1", "c"]


def test_health_of_a_physical_device_reaches_all_its_replicas() -> None:
    config = parse_sharing(ts({"name": GPU, "replicas": 3}))
    physical = gpus(2)
    before = advertise(physical, config)
    assert all(d.healthy for d in before)
    physical[1] = physical[1].with_health(False, "fell off the bus")
    after = {d.id: d for d in advertise(physical, config)}
    assert [after[f"GPU-1::{n}"].reason for n in range(3)] == ["fell off the bus"] * 3
    assert all(after[f"GPU-0::{n}"].healthy for n in range(3))


def test_replica_ids_round_trip() -> None:
    assert to_physical(["GPU-0::1", "GPU-0::0", "GPU-1", "GPU-1::3"]) == ["GPU-0", "GPU-1"]
    assert physical_id("MIG-abc::12") == "MIG-abc"
    assert physical_id("weird::name") == "weird::name"  # not a replica suffix
    assert (replica_number("a::7"), replica_number("a")) == (7, 0)
    assert not is_replica("::3")


def test_fail_requests_greater_than_one() -> None:
    strict = parse_sharing(ts({"name": GPU, "replicas": 4}, failRequestsGreaterThanOne=True))
    strict.check_request(GPU, ["GPU-0::1"])
    strict.check_request(GPU, ["GPU-0", "GPU-1"])  # whole devices are not limited
    with pytest.raises(AllocationError) as err:
        strict.check_request(GPU, ["GPU-0::0", "GPU-0::1"])
    assert err.value.code == "INVALID_ARGUMENT"
    assert "GPU-0::0, GPU-0::1" in str(err.value) and "failRequestsGreaterThanOne" in str(err.value)
    lax = parse_sharing(ts({"name": GPU, "replicas": 4}))
    lax.check_request(GPU, ["GPU-0::0", "GPU-0::1"])


@pytest.mark.parametrize(
    ("raw", "field", "reason"),
    [
        ([], "sharing", "expected a mapping, got []"),
        ({"timeslicing": {}}, "sharing.timeslicing", "unknown key; did you mean 'timeSlicing'?"),
        ({"mps": {"resources": [{"name": GPU, "replicas": 1}]}},
         "sharing.mps.resources[0].replicas", "at least 2"),
        ({**ts({"name": GPU, "replicas": 2}),
          "mps": {"resources": [{"name": GPU, "replicas": 2}]}},
         "sharing.mps", "both timeSlicing and mps"),
        ({"timeSlicing": []}, "sharing.timeSlicing", "expected a mapping"),
        ({"timeSlicing": {"rename": True}}, "sharing.timeSlicing.rename",
         "unknown key (known: failRequestsGreaterThanOne, renameByDefault, resources)"),
        ({"timeSlicing": {"strategy": "packed"}}, "sharing.timeSlicing.strategy", "strategy"),
        ({"timeSlicing": {"renameByDefault": "yes"}}, "sharing.timeSlicing.renameByDefault",
         "true or false"),
        ({"timeSlicing": {"resources": {"name": GPU}}}, "sharing.timeSlicing.resources",
         "expected a list"),
        (ts("gpu"), "sharing.timeSlicing.resources[0]", "expected a mapping"),
        (ts({"replicas": 2}), "sharing.timeSlicing.resources[0].name",
         "required option is missing"),
        (ts({"name": GPU}), "sharing.timeSlicing.resources[0].replicas",
         "required option is missing"),
        (ts({"name": GPU, "replicas": 1}), "sharing.timeSlicing.resources[0].replicas",
         "at least 2"),
        (ts({"name": GPU, "replicas": 0}), "sharing.timeSlicing.resources[0].replicas",
         "at least 2"),
        (ts({"name": GPU, "replicas": "4"}), "sharing.timeSlicing.resources[0].replicas",
         "expected an integer"),
        (ts({"name": GPU, "replicas": True}), "sharing.timeSlicing.resources[0].replicas",
         "expected an integer"),
        (ts({"name": GPU, "replicas": 2.5}), "sharing.timeSlicing.resources[0].replicas",
         "expected an integer"),
        (ts({"name": GPU, "replica": 3}),
         "sharing.timeSlicing.resources[0].replica",
         "unknown key; did you mean 'replicas'? (known: devices, name, rename, replicas)"),
        (ts({"name": "Nvidia.com/gpu", "replicas": 2}),
         "sharing.timeSlicing.resources[0].name", "lowercase DNS subdomain"),
        (ts({"name": "nvidia.com/-gpu", "replicas": 2}),
         "sharing.timeSlicing.resources[0].name", "name part"),
        (ts({"name": "kubernetes.io/gpu", "replicas": 2}),
         "sharing.timeSlicing.resources[0].name", "reserved kubernetes.io namespace"),
        (ts({"name": GPU, "replicas": 2, "rename": "x" * 64}),
         "sharing.timeSlicing.resources[0].rename", "longer than 63 characters"),
        (ts({"name": GPU, "replicas": 2, "devices": "some"}),
         "sharing.timeSlicing.resources[0].devices", "expected 'all', a count or a non-empty list"),
        (ts({"name": GPU, "replicas": 2, "devices": 0}),
         "sharing.timeSlicing.resources[0].devices", "at least 1"),
        (ts({"name": GPU, "replicas": 2, "devices": []}),
         "sharing.timeSlicing.resources[0].devices", "non-empty list"),
        (ts({"name": GPU, "replicas": 2, "devices": [0, -1]}),
         "sharing.timeSlicing.resources[0].devices[1]", "negative"),
        (ts({"name": GPU, "replicas": 2, "devices": [0, {"id": 1}]}),
         "sharing.timeSlicing.resources[0].devices[1]", "device ID or index"),
        (ts({"name": GPU, "replicas": 2}, {"name": GPU, "replicas": 3}),
         "sharing.timeSlicing.resources[1].name", "already shared by"),
    ],
)  # fmt: skip
def test_bad_config_names_the_field_and_file(raw: Any, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_sharing(raw, "/etc/hetero-dp/config.yaml")
    assert err.value.field == field
    assert err.value.source == "/etc/hetero-dp/config.yaml"
    assert reason in str(err.value)
    assert "/etc/hetero-dp/config.yaml" in str(err.value) and field in str(err.value)


def test_empty_blocks_share_nothing() -> None:
    for raw in (None, {}, {"timeSlicing": None}, {"timeSlicing": {}}, {"mps": None}):
        assert not parse_sharing(raw).enabled  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("devices", "field", "reason"),
    [
        ([7], "devices[0]", "device '7' does not exist in nvidia.com/gpu"),
        (["GPU-0", "GPU-9"], "devices[1]", "'GPU-9' does not exist"),
        (5, "devices", "asks for 5 shared devices but nvidia.com/gpu has 3"),
    ],
)
def test_sharing_a_missing_device_is_a_start_up_error(
    devices: Any, field: str, reason: str
) -> None:
    config = parse_sharing(ts({"name": GPU, "replicas": 2, "devices": devices}), "cfg.yaml")
    with pytest.raises(ConfigError) as err:
        validate_sharing(config, gpus(3))
    assert err.value.field == f"sharing.timeSlicing.resources[0].{field}"
    assert err.value.source == "cfg.yaml"
    assert reason in str(err.value)
    assert "GPU-0 (index 0)" in str(err.value) or field == "devices"


def test_listing_devices_of_a_resource_not_discovered_is_an_error() -> None:
    config = parse_sharing(ts({"name": "example.com/fpga", "replicas": 2, "devices": [0]}))
    with pytest.raises(ConfigError, match="none discovered"):
        validate_sharing(config, gpus(1))
    # 'all' of a resource that is not there is fine: nothing to share yet.
    validate_sharing(parse_sharing(ts({"name": "example.com/fpga", "replicas": 2})), gpus(1))


def test_bad_shared_names_and_ids_are_caught_against_devices() -> None:
    long_part = "g" * 60
    config = parse_sharing(ts({"name": long_part, "replicas": 2}, renameByDefault=True))
    with pytest.raises(ConfigError) as err:
        validate_sharing(config, gpus(1, f"nvidia.com/{long_part}"))
    assert err.value.field == "sharing.timeSlicing.renameByDefault"
    odd = [Device("a::b", GPU)]
    with pytest.raises(ConfigError, match="contains '::'"):
        validate_sharing(parse_sharing(ts({"name": GPU, "replicas": 2})), odd)


def test_replica_policy_parsing() -> None:
    assert parse_replica_policy(None) == "distributed"
    assert parse_replica_policy("packed") == "packed"
    with pytest.raises(ConfigError) as err:
        parse_replica_policy("round-robin", "flags.plugin.sharedDevicesAllocationPolicy", "c.yaml")
    assert err.value.field == "flags.plugin.sharedDevicesAllocationPolicy"


def test_default_config_is_inert() -> None:
    config = SharingConfig()
    config.check_request(GPU, ["a::0", "a::1"])
    assert config.shared_name(GPU) == GPU and config.replicas_for(GPU) == 1


def test_replica_ids_are_one_fact_on_the_public_face():
    from hetero_dp import Device, is_replica, replica_base
    from hetero_dp.allocation.sharing import advertise, parse_sharing

    gpu = Device(id="GPU-1", resource="nvidia.com/gpu", index=0)
    mig = Device(id="MIG-9", resource="nvidia.com/mig-1g.5gb", parent="GPU-1", index=1)
    cfg = parse_sharing(
        {
            "timeSlicing": {
                "resources": [
                    {"name": "nvidia.com/gpu", "replicas": 2},
                    {"name": "nvidia.com/mig-1g.5gb", "replicas": 2},
                ]
            }
        }
    )
    replicas = advertise([gpu, mig], cfg)
    assert [d.id for d in replicas] == ["GPU-1::0", "GPU-1::1", "MIG-9::0", "MIG-9::1"]
    assert all(is_replica(d.id) for d in replicas)
    # the device behind a replica, and for a slice's replica its GPU
    assert [d.physical_id for d in replicas] == ["GPU-1", "GPU-1", "GPU-1", "GPU-1"]
    assert [replica_base(d.id) for d in replicas] == ["GPU-1", "GPU-1", "MIG-9", "MIG-9"]
    assert replica_base("weird::name") == "weird::name" and not is_replica("weird::name")
