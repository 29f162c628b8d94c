"""A resource's settings are typed (engine/settings.py ``ResourceSettings``): the file's
``resources.<name>`` entries and a backend's ``resource_defaults`` answers are read by
the one options reader, so a backend's mistake is named as a file's is (the backend,
the field, the reason) instead of reaching Allocate as an unchecked string."""

from __future__ import annotations

import logging

import pytest

from hetero_dp import hookimpl
from hetero_dp.allocation.delivery import Delivery
from hetero_dp.engine.config import ResourceSettings, load_config
from hetero_dp.model.errors import ConfigError

from .scripted import Scripted, make_devices

RES = "example.com/accel"


class WithDefaults(Scripted):
    def __init__(self, devices, defaults):
        super().__init__(devices)
        self.defaults = defaults

    @hookimpl
    def resource_defaults(self, resource):
        return self.defaults


def test_an_entry_is_read_once_into_attributes_and_a_delivery(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text(
        "resources:\n  a.com/xx:\n    deliver: cdi-cri, cdi-cri\n    replicaPolicy: packed\n"
    )
    settings = load_config(p, env={}).resource_settings("a.com/xx")
    assert settings.deliver == ("cdi-cri",)
    assert settings.delivery == Delivery(("cdi-cri",), None, "cdi.k8s.io/")
    assert settings.policy == "packed" and settings.preferred is True
    # a resource the file does not name: every key left out, the built-in defaults
    assert load_config(p, env={}).resource_settings("b.com/y") == ResourceSettings()


def test_the_file_s_entry_wins_over_the_backend_s_defaults_key_by_key():
    defaults = ResourceSettings(deliver=["cdi-cri"], cdi_kind="a.com/kk", replica_policy="spread")
    entry = ResourceSettings(replica_policy="packed", preferred_allocation=False)
    merged = entry.over(defaults)
    assert (merged.policy, merged.preferred) == ("packed", False)
    assert merged.delivery == Delivery(("cdi-cri",), "a.com/kk", "cdi.k8s.io/")


@pytest.mark.parametrize(
    ("entry", "field", "reason"),
    [
        ({"deliver": ["cdi-cri", 3]}, "deliver", "unknown delivery strategies [3]"),
        ({"preferredAllocation": [True]}, "preferredAllocation", "expected true or false"),
        ({"cdiKind": "no kind"}, "cdiKind", ""),
        ({"deliver": ["cdi-cri"]}, "cdiKind", "the CDI kind defaults to the resource name"),
    ],
)
def test_a_wrong_entry_names_the_file_the_resource_and_the_key(tmp_path, entry, field, reason):
    import yaml

    p = tmp_path / "config.yaml"
    p.write_text(yaml.safe_dump({"resources": {"a.com/x": entry}}))
    with pytest.raises(ConfigError) as err:
        load_config(p, env={})
    assert str(err.value).startswith(f"{p}, field 'resources.a.com/x.{field}': {reason}")


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        (
            {"replicaPolicy": "packd"},
            "backend scripted, field 'resource_defaults(example.com/accel).replicaPolicy': "
            "expected one of distributed, packed, spread, got 'packd'",
        ),
        (
            {"deliverr": ["cdi-cri"]},
            "backend scripted, field 'resource_defaults(example.com/accel).deliverr': "
            "unknown key; did you mean 'deliver'?",
        ),
        (
            {"deliver": ["cdi-cri"], "cdiKind": 7},
            "backend scripted, field 'resource_defaults(example.com/accel).cdiKind': "
            "expected a string, got 7",
        ),
    ],
)
async def test_a_backend_s_wrong_defaults_are_refused_naming_the_backend_and_the_key(
    fake_kubelet, plugin_runner, caplog, defaults, message
):
    caplog.set_level(logging.ERROR, logger="hetero_dp.engine.daemon")
    daemon = await plugin_runner.start(WithDefaults(make_devices(RES, 2), defaults))
    await fake_kubelet.wait_registered(RES)
    said = [r.getMessage() for r in caplog.records if "resource_defaults" in r.getMessage()]
    assert any(m.startswith(message) for m in said), said
    # what was refused is not used: the resource keeps the built-in defaults
    assert daemon.resources[RES].settings == ResourceSettings()


async def test_a_backend_s_defaults_are_read_as_typed_values(fake_kubelet, plugin_runner):
    """``preferredAllocation: "false"`` from a backend turns the answer off (read as a
    flag's ``false`` is), where ``bool("false")`` had left it on."""
    backend = WithDefaults(make_devices(RES, 2), {"preferredAllocation": "false"})
    daemon = await plugin_runner.start(backend)
    res = await fake_kubelet.wait_registered(RES)
    assert res.options.get_preferred_allocation_available is False
    assert daemon.resources[RES].settings.preferred is False


def test_a_merged_delivery_is_the_one_the_merged_keys_give():
    """``over`` builds the merged delivery from the two parsed ones: for every way the
    keys split between the file and the backend, it is what parsing them together
    gives (allocation/delivery.py)."""
    import itertools

    from hetero_dp.allocation.delivery import parse_delivery

    file_keys = {
        "deliver": "cdi-annotations",
        "cdiKind": "b.com/ff",
        "cdiAnnotationPrefix": "x.io/",
    }
    backend_keys = {"deliver": ["cdi-cri", "device-specs"], "cdiKind": "a.com/kk"}
    names = {
        "deliver": "deliver",
        "cdiKind": "cdi_kind",
        "cdiAnnotationPrefix": "cdi_annotation_prefix",
    }

    def subsets(keys):
        return [
            dict(c) for n in range(len(keys) + 1) for c in itertools.combinations(keys.items(), n)
        ]

    for mine, theirs in itertools.product(subsets(file_keys), subsets(backend_keys)):
        entry = ResourceSettings(**{names[k]: v for k, v in mine.items()})
        defaults = ResourceSettings(**{names[k]: v for k, v in theirs.items()})
        assert entry.over(defaults).delivery == parse_delivery({**theirs, **mine}), (mine, theirs)
        assert entry.over(defaults) == ResourceSettings(
            **{names[k]: v for k, v in {**theirs, **mine}.items()}
        )
