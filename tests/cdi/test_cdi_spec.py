"""Spec generation: representative device sets validate; the rules hold; bad input fails."""

from __future__ import annotations

import dataclasses
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_dp import ConfigError, Device, DeviceNode, Mount
from hetero_dp.allocation.cdi import (
    FILLER_ENV,
    CDINameError,
    build_spec,
    list_env_keys,
    qualified_name,
    spec_file_name,
    validate_kind,
)
from tests.cdi import samples
from tests.cdi.schema_check import assert_valid_cdi_spec


def _by_name(spec: dict) -> dict[str, dict]:
    return {d["name"]: d["containerEdits"] for d in spec["devices"]}


def test_plain_dev_glob_set() -> None:
    spec = assert_valid_cdi_spec(build_spec("acme.com/accel", samples.accel_glob(3)))
    assert spec["cdiVersion"] == "0.3.0"
    assert spec["kind"] == "acme.com/accel"
    assert "containerEdits" not in spec
    assert _by_name(spec) == {
        f"accel{i}": {"deviceNodes": [{"path": f"/dev/accel/accel{i}", "permissions": "rw"}]}
        for i in range(3)
    }


def test_amd_like_set_puts_kfd_in_container_edits_once() -> None:
    spec = assert_valid_cdi_spec(build_spec("amd.com/gpu", samples.amd_gpus()))
    # PCI addresses start with a digit: that needs 0.5.0 (dots in names need nothing).
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["containerEdits"] == {"deviceNodes": [{"path": "/dev/kfd", "permissions": "rw"}]}
    edits = _by_name(spec)
    assert [n["path"] for n in edits["0000:43:00.0"]["deviceNodes"]] == [
        "/dev/dri/card2",
        "/dev/dri/renderD129",
    ]


def test_nvidia_like_set() -> None:
    spec = assert_valid_cdi_spec(build_spec(samples.NVIDIA_KIND, samples.nvidia_gpus()))
    assert spec["cdiVersion"] == "0.3.0"  # UUID names start with a letter, class has no dot
    common = spec["containerEdits"]
    assert [n["path"] for n in common["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ]
    assert common["mounts"] == [
        {
            "hostPath": "/usr/local/nvidia/bin",
            "containerPath": "/usr/local/nvidia/bin",
            "options": ["rbind", "rprivate", "ro"],
        }
    ]
    mig = _by_name(spec)[samples.MIG_UUID]
    assert mig["deviceNodes"] == [
        {"path": "/dev/nvidia0", "permissions": "rw"},
        {"path": "/dev/nvidia-caps/nvidia-cap21", "permissions": "r"},
        {"path": "/dev/nvidia-caps/nvidia-cap22", "permissions": "r"},
    ]
    # NVIDIA_VISIBLE_DEVICES differs per device: a list key, left to the response.
    assert mig["env"] == ["NVIDIA_DRIVER_CAPABILITIES=compute,utility"]


def test_nvidia_index_ids_need_0_5_0() -> None:
    spec = assert_valid_cdi_spec(build_spec("nvidia.com/gpu", samples.nvidia_by_index()))
    assert spec["cdiVersion"] == "0.5.0"
    assert sorted(_by_name(spec)) == ["0", "0:0", "1"]


def test_dot_in_class_needs_0_6_0() -> None:
    devs = [dataclasses.replace(d, resource="nvidia.com/mig-1g.5gb") for d in samples.accel_glob(1)]
    spec = assert_valid_cdi_spec(build_spec("nvidia.com/mig-1g.5gb", devs))
    assert spec["cdiVersion"] == "0.6.0"


def test_host_path_differing_from_container_path_needs_0_5_0() -> None:
    dev = Device(id="a0", resource="acme.com/xx", nodes=(DeviceNode("/dev/acme0", "/dev/acme"),))
    spec = assert_valid_cdi_spec(build_spec("acme.com/xx", [dev]))
    assert spec["cdiVersion"] == "0.5.0"
    assert _by_name(spec)["a0"]["deviceNodes"] == [
        {"path": "/dev/acme", "hostPath": "/dev/acme0", "permissions": "rw"}
    ]


def test_device_without_own_edits_gets_filler_env() -> None:
    # Only shared nodes: CDI rejects a device with empty edits, so it gets a marker.
    dev = Device(id="v0", resource="acme.com/vf", nodes=(DeviceNode("/dev/acme", shared=True),))
    spec = assert_valid_cdi_spec(build_spec("acme.com/vf", [dev]))
    assert _by_name(spec)["v0"] == {"env": [f"{FILLER_ENV}=acme.com/vf=v0"]}


def test_list_env_keys() -> None:
    devs = [
        Device(id="a", resource="x.com/yy", env={"L": "a", "S": "1"}),
        Device(id="b", resource="x.com/yy", env={"L": "b", "S": "1"}),
        Device(id="c", resource="x.com/yy", env={"O": "only"}),
    ]
    assert list_env_keys(devs) == {"L"}


def test_spec_is_deterministic() -> None:
    assert build_spec("amd.com/gpu", samples.amd_gpus()) == build_spec(
        "amd.com/gpu", samples.amd_gpus()
    )


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind",
    [
        "",
        "gpu",
        "nvidia.com/",
        "/gpu",
        "nvidia.com/gpu/x",
        "Nvidia.com/gpu",  # vendor must be a lowercase DNS name
        "nvidia_x.com/gpu",
        "1vendor.com/gpu",  # the reference parser wants a letter first
        "nvidia.com/1g",  # class too
        "nvidia.com/g",  # 1-character class: the Go parser slices it out of range
        "nvidia.com/gpu-",
        "nvidia.com/g pu",
        "nvidia.com/" + "g" * 64,
        None,
        42,
    ],
)
def test_bad_kinds_raise_config_error_naming_the_field(kind: object) -> None:
    with pytest.raises(ConfigError) as e:
        validate_kind(kind, field="resources.acme.com/x.cdiKind")
    assert e.value.field == "resources.acme.com/x.cdiKind"
    assert "resources.acme.com/x.cdiKind" in str(e.value)


@pytest.mark.parametrize(
    "kind",
    ["nvidia.com/gpu", "k8s.device-plugin.nvidia.com/gpu", "a1/B_c.d-e", "localvendor/gpu"],
)
def test_good_kinds(kind: str) -> None:
    assert validate_kind(kind) == kind


def test_qualified_name() -> None:
    assert qualified_name("nvidia.com/gpu", "GPU-1") == "nvidia.com/gpu=GPU-1"
    assert qualified_name("nvidia.com/gpu", "0:1") == "nvidia.com/gpu=0:1"
    with pytest.raises(CDINameError, match="'GPU-1::2x/'") as e:
        qualified_name("nvidia.com/gpu", "GPU-1::2x/")
    assert e.value.ids == ["GPU-1::2x/"]
    with pytest.raises(ConfigError, match="cdiKind"):
        qualified_name("gpu", "0")


def test_ids_that_are_not_cdi_names_are_rejected_all_at_once() -> None:
    devs = [
        Device(id=i, resource="acme.com/xx", nodes=(DeviceNode("/dev/null"),))
        for i in ("ok0", "dri/card0", "-lead", "trail-", "sp ace", "ok1")
    ]
    with pytest.raises(CDINameError) as e:
        build_spec("acme.com/xx", devs)
    assert e.value.ids == ["dri/card0", "-lead", "trail-", "sp ace"]
    assert "device-specs" in str(e.value)  # says what to do instead


def test_duplicate_ids_rejected() -> None:
    devs = samples.accel_glob(2) + samples.accel_glob(1)
    with pytest.raises(ConfigError, match="duplicate device IDs \\['accel0'\\]"):
        build_spec("acme.com/accel", devs)


def test_shared_nodes_that_disagree_are_rejected() -> None:
    a = Device(id="a", resource="x.com/yy", nodes=(DeviceNode("/dev/ctl", shared=True),))
    b = Device(
        id="b", resource="x.com/yy", nodes=(DeviceNode("/dev/ctl", permissions="r", shared=True),)
    )
    with pytest.raises(ConfigError, match=r"'a' and 'b'.*'/dev/ctl'"):
        build_spec("x.com/yy", [a, b])


def test_relative_paths_rejected() -> None:
    dev = Device(id="a", resource="x.com/yy", mounts=(Mount("lib", "/lib"),))
    with pytest.raises(ConfigError, match="device 'a': mount paths must be absolute"):
        build_spec("x.com/yy", [dev])


def test_empty_device_set_rejected() -> None:
    with pytest.raises(ConfigError, match="at least one device"):
        build_spec("x.com/yy", [])


def test_file_names_are_distinct_for_kinds_that_would_clash_with_a_dash() -> None:
    # 'a-b.com' + 'c' and 'a' + 'b.com-c' would both be 'a-b.com-c' with '-' joining.
    assert spec_file_name("a-b.com/cc") != spec_file_name("ab/b.com-cc")
    assert spec_file_name("nvidia.com/gpu") == "hetero-dp_nvidia.com_gpu.json"


# --- property: any device set a backend can describe gives a valid spec -------------------

_id_chars = string.ascii_letters + string.digits + "-_.:"
_ids = st.builds(
    lambda a, mid, b: a + mid + b,
    st.sampled_from(string.ascii_letters + string.digits),
    st.text(_id_chars, max_size=20),
    st.sampled_from(string.ascii_letters + string.digits),
)
_paths = st.lists(
    st.sampled_from(["dev", "dri", "acme", "x1", "card"]), min_size=1, max_size=3
).map(lambda p: "/" + "/".join(p))
_nodes = st.builds(
    DeviceNode,
    host_path=_paths,
    container_path=st.one_of(st.just(""), _paths),
    permissions=st.sampled_from(["r", "rw", "rwm", "w"]),
    shared=st.booleans(),
)
_mounts = st.builds(Mount, host_path=_paths, container_path=_paths, read_only=st.booleans())
_env = st.dictionaries(st.sampled_from(["A_LIST", "B", "C"]), st.text(string.printable, max_size=8))


@settings(max_examples=80, deadline=None)
@given(
    ids=st.lists(_ids, min_size=1, max_size=6, unique=True),
    data=st.data(),
    kind=st.sampled_from(["acme.com/accel", "nvidia.com/mig-1g.5gb", "x9.io/Y_z"]),
)
def test_any_device_set_yields_a_valid_spec(ids, data, kind) -> None:
    # Shared paths must agree between devices, so draw them once for the whole set.
    shared = {n.container_path: n for n in data.draw(st.lists(_nodes, max_size=3)) if n.shared}
    devices = [
        Device(
            id=i,
            resource=kind,
            nodes=(
                *[n for n in data.draw(st.lists(_nodes, max_size=3)) if not n.shared],
                *list(shared.values())[: data.draw(st.integers(0, len(shared)))],
            ),
            mounts=tuple(data.draw(st.lists(_mounts, max_size=2))),
            env=data.draw(_env),
        )
        for i in ids
    ]
    spec = assert_valid_cdi_spec(build_spec(kind, devices))
    assert [d["name"] for d in spec["devices"]] == ids
