"""Delivery strategies on an Allocate response built from device records."""

from __future__ import annotations

import dataclasses
import re

import pytest

from hetero_dp import AllocationError, ConfigError, ContainerResponse, Device, DeviceNode
from hetero_dp.allocation.allocate import build_response
from hetero_dp.allocation.delivery import (
    DEFAULT_STRATEGIES,
    Delivery,
    annotation_key,
    apply_delivery,
    parse_delivery,
)
from tests.cdi import samples

# A Kubernetes annotation key: DNS-subdomain prefix, '/', a 63-character qualified name.
_ANNOTATION_KEY = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def allocate(devices: list[Device], settings: dict) -> ContainerResponse:
    return apply_delivery(build_response(devices), devices, parse_delivery(settings))


def _cdi_keys(r: ContainerResponse, prefix: str = "cdi.k8s.io/") -> list[str]:
    return [k for k in r.annotations if k.startswith(prefix)]


GPUS = samples.nvidia_gpus()[:2]
NAMES = [f"nvidia.com/gpu={u}" for u in samples.GPU_UUIDS]


def test_device_specs_is_the_default_and_changes_nothing() -> None:
    default = build_response(GPUS)
    for settings in ({}, {"deliver": ["device-specs"]}):
        assert apply_delivery(default, GPUS, parse_delivery(settings)) == default
    assert len(default.devices) == 6  # 4 shared control nodes + 2 GPUs
    assert default.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(samples.GPU_UUIDS)


def test_cdi_cri_carries_exactly_the_qualified_names() -> None:
    r = allocate(GPUS, {"deliver": ["cdi-cri"]})
    assert r.cdi_devices == NAMES
    assert r.devices == [] and r.mounts == []
    assert _cdi_keys(r) == []
    # env stays: the list key can only be joined here, the spec leaves it out
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(samples.GPU_UUIDS)


def test_cdi_annotations_carry_exactly_the_qualified_names() -> None:
    r = allocate(GPUS, {"deliver": ["cdi-annotations"]})
    (key,) = _cdi_keys(r)
    assert r.annotations[key] == ",".join(NAMES)
    assert _ANNOTATION_KEY.match(key), key
    assert key.startswith("cdi.k8s.io/hetero-dp_")
    assert r.cdi_devices == [] and r.devices == [] and r.mounts == []


def test_strategies_combine() -> None:
    r = allocate(GPUS, {"deliver": ["device-specs", "cdi-cri", "cdi-annotations"]})
    assert r.cdi_devices == NAMES
    assert [r.annotations[k] for k in _cdi_keys(r)] == [",".join(NAMES)]
    assert r.devices == build_response(GPUS).devices  # device specs kept
    assert r.mounts == build_response(GPUS).mounts


def test_custom_kind_and_prefix() -> None:
    r = allocate(
        GPUS,
        {
            "deliver": ["cdi-annotations", "cdi-cri"],
            "cdiKind": samples.NVIDIA_KIND,
            "cdiAnnotationPrefix": "nvidia.cdi.k8s.io/",
        },
    )
    names = [f"{samples.NVIDIA_KIND}={u}" for u in samples.GPU_UUIDS]
    assert r.cdi_devices == names
    (key,) = _cdi_keys(r, "nvidia.cdi.k8s.io/")
    assert r.annotations[key] == ",".join(names)
    assert _cdi_keys(r) == []


def test_index_ids_and_mig_names() -> None:
    devs = samples.nvidia_by_index()
    r = allocate(devs, {"deliver": ["cdi-cri"]})
    assert r.cdi_devices == ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=0:0"]


def test_record_annotations_and_existing_names_stay() -> None:
    devs = [dataclasses.replace(d, annotations={"acme.com/slot": d.id}) for d in GPUS[:1]]
    default = build_response(devs)
    default.cdi_devices.append("acme.com/extra=all")
    r = apply_delivery(default, devs, parse_delivery({"deliver": ["cdi-cri", "cdi-annotations"]}))
    assert r.annotations["acme.com/slot"] == samples.GPU_UUIDS[0]
    assert r.cdi_devices == ["acme.com/extra=all", NAMES[0]]
    # the default passed in is not changed
    assert default.cdi_devices == ["acme.com/extra=all"]
    assert len(default.devices) == 5


def test_annotation_key_is_deterministic_and_unique_per_kind_and_ids() -> None:
    k = annotation_key("cdi.k8s.io/", "nvidia.com/gpu", ["0", "1"])
    assert k == annotation_key("cdi.k8s.io/", "nvidia.com/gpu", ["0", "1"])
    others = {
        annotation_key("cdi.k8s.io/", "amd.com/gpu", ["0", "1"]),  # same IDs, other resource
        annotation_key("cdi.k8s.io/", "nvidia.com/gpu", ["0"]),
        annotation_key("cdi.k8s.io/", "nvidia.com/gpu", ["01"]),
        annotation_key("cdi.k8s.io/", "nvidia.com/gpu", ["1", "0"]),
    }
    assert k not in others and len(others) == 4


def test_two_resources_in_one_container_do_not_share_a_key() -> None:
    amd = allocate(samples.amd_gpus(), {"deliver": ["cdi-annotations"]})
    nv = allocate(GPUS, {"deliver": ["cdi-annotations"]})
    assert set(_cdi_keys(amd)).isdisjoint(_cdi_keys(nv))


def test_ids_that_are_not_cdi_names_fail_the_allocation_naming_them() -> None:
    devs = [
        Device(id=i, resource="acme.com/xx", nodes=(DeviceNode("/dev/null"),))
        for i in ("ok", "bad/id", "bad id")
    ]
    with pytest.raises(AllocationError) as e:
        allocate(devs, {"deliver": ["cdi-cri"]})
    assert "'bad/id', 'bad id'" in str(e.value)
    assert e.value.code == "FAILED_PRECONDITION"
    # the same IDs are fine with device specs
    assert allocate(devs, {"deliver": ["device-specs"]}).devices


def test_empty_request_gets_no_names() -> None:
    cdi = parse_delivery({"deliver": ["cdi-cri"]})
    assert apply_delivery(ContainerResponse(), [], cdi) == ContainerResponse()


# --- parse_delivery ----------------------------------------------------------------------


def test_parse_defaults() -> None:
    d = parse_delivery({}, "resources.acme.com/xx")
    assert d == Delivery(DEFAULT_STRATEGIES, None, "cdi.k8s.io/")
    assert not d.uses_cdi and d.device_specs
    assert d.kind_for("acme.com/xx") == "acme.com/xx"


def test_parse_accepts_a_comma_string_and_dedupes() -> None:
    d = parse_delivery({"deliver": "cdi-cri, cdi-annotations,cdi-cri"})
    assert d.strategies == ("cdi-cri", "cdi-annotations")
    assert d.uses_cdi and not d.device_specs


@pytest.mark.parametrize(
    ("settings", "field", "match"),
    [
        ({"deliver": ["envvar"]}, "r.deliver", "unknown delivery strategies \\['envvar'\\]"),
        ({"deliver": []}, "r.deliver", "non-empty list"),
        ({"deliver": 3}, "r.deliver", "non-empty list"),
        ({"cdiKind": "gpu"}, "r.cdiKind", "vendor.com/class"),
        ({"cdiKind": "Nvidia.com/gpu"}, "r.cdiKind", "lowercase DNS"),
        ({"cdiAnnotationPrefix": "cdi.k8s.io"}, "r.cdiAnnotationPrefix", "one '/'"),
        ({"cdiAnnotationPrefix": "CDI.io/"}, "r.cdiAnnotationPrefix", "DNS subdomain"),
        ({"cdiAnnotationPrefix": "cdi.k8s.io/a/"}, "r.cdiAnnotationPrefix", "one '/'"),
        ({"cdiAnnotationPrefix": "cdi.k8s.io/-x"}, "r.cdiAnnotationPrefix", "after '/'"),
        ({"cdiAnnotationPrefix": "cdi.k8s.io/" + "x" * 40}, "r.cdiAnnotationPrefix", "at most"),
        ({"cdiAnnotationPrefix": 7}, "r.cdiAnnotationPrefix", "string"),
    ],
)
def test_parse_errors_name_the_field(settings: dict, field: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        parse_delivery(settings, "r")
    assert e.value.field == field


def test_default_kind_checked_against_the_resource_name() -> None:
    with pytest.raises(ConfigError, match=r"defaults to the resource name.*set cdiKind") as e:
        parse_delivery({"deliver": ["cdi-cri"]}, "r", resource="acme.com/3d")
    assert e.value.field == "r.cdiKind"
    # no CDI strategy: the resource name need not be a CDI kind
    parse_delivery({}, "r", resource="acme.com/3d")
    # an explicit kind wins
    d = parse_delivery(
        {"deliver": ["cdi-cri"], "cdiKind": "acme.com/three-d"}, resource="acme.com/3d"
    )
    assert d.kind_for("acme.com/3d") == "acme.com/three-d"


def test_prefix_with_a_name_start_is_allowed() -> None:
    d = parse_delivery({"deliver": ["cdi-annotations"], "cdiAnnotationPrefix": "cdi.k8s.io/acme-"})
    key = annotation_key(d.annotation_prefix, "acme.com/xx", ["0"])
    assert _ANNOTATION_KEY.match(key) and key.startswith("cdi.k8s.io/acme-hetero-dp_")


def test_bad_settings_are_refused_where_they_are_read_never_at_allocate() -> None:
    """apply_delivery takes a Delivery parsed when the settings were read (the file's
    entry, a backend's defaults): a bad one never reaches an Allocate."""
    from hetero_dp.engine.settings import ResourceSettings

    with pytest.raises(ConfigError, match="unknown delivery strategies") as e:
        ResourceSettings(deliver=["volume-mounts"])
    assert e.value.field == "deliver"
    with pytest.raises(ConfigError, match="set cdiKind"):
        ResourceSettings(deliver=["cdi-cri"]).check_kind("acme.com/3d")
