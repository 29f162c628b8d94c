"""Path settings (issue #36 point 5): a NUL byte, a relative path, one over PATH_MAX or
with a part over NAME_MAX is a configuration error naming the field and where the
value came from, whether the file, the environment or a flag gave it. A NUL in
``labels.dir`` was a raw ``ValueError: embedded null byte`` traceback at every publish."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from hetero_dp.engine.config import load_config
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.options import option, parse_options

# every path setting of the core: the field as written, how a file gives it
PATHS: dict[str, Any] = {
    "kubeletDir": lambda v: {"kubeletDir": v},
    "pluginsRegistryDir": lambda v: {"pluginsRegistryDir": v, "registration": "watcher"},
    "cdi.dir": lambda v: {"cdi": {"dir": v}},
    "cdi.runtimeConfig": lambda v: {"cdi": {"runtimeConfig": v}},
    "labels.dir": lambda v: {"labels": {"dir": v}},
    "metrics.readyFile": lambda v: {"metrics": {"readyFile": v}},
    "attribution.podResourcesSocket": lambda v: {"attribution": {"podResourcesSocket": v}},
    "attribution.procRoot": lambda v: {"attribution": {"procRoot": v}},
}
BAD = {
    "nul": ("/var/lib/kube\0let", "NUL byte"),
    "relative": ("var/lib/kubelet", "must be an absolute path, got 'var/lib/kubelet'"),
    "path-max": ("/" + "a/" * 2100, "at most 4095 bytes, this one has 4201"),
    "name-max": ("/tmp/" + "n" * 256 + "/x", "at most 255 bytes, one has 256"),
}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("field", list(PATHS))
def test_an_impossible_path_in_the_file_names_the_field(field: str, bad: str) -> None:
    value, reason = BAD[bad]
    with pytest.raises(ConfigError) as err:
        load_config(raw=PATHS[field](value), env={})
    assert err.value.field == field
    assert reason in err.value.reason, err.value.reason


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"HETERO_DP_KUBELET_DIR": "/x\0y"}, "kubeletDir"),
        ({"HETERO_DP_PLUGINS_REGISTRY_DIR": "rel/dir"}, "pluginsRegistryDir"),
    ],
)
def test_an_impossible_path_from_the_environment_names_the_variable(env, field) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(raw={}, env=env)
    assert err.value.field == field
    assert err.value.source == f"env {next(iter(env))}"


def test_an_impossible_path_from_a_flag_names_the_flag() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(raw={}, env={}, overrides={"cdi": {"dir": "/run/c\0di"}})
    assert (err.value.field, err.value.source) == ("cdi.dir", "flag --cdi-dir")


def test_an_empty_optional_path_still_means_none() -> None:
    cfg = load_config(raw={"cdi": {"runtimeConfig": ""}, "metrics": {"readyFile": ""}}, env={})
    assert cfg.cdi.runtime_config == "" and cfg.metrics.ready_file == ""


@dataclass(frozen=True)
class WithPath:
    root: str = option("/", help="a backend's path option", path=True)


def test_a_backend_declares_a_path_option_the_same_way() -> None:
    assert parse_options(WithPath, {"root": "/run/x"}, field="backends.b").root == "/run/x"
    with pytest.raises(ConfigError) as err:
        parse_options(WithPath, {"root": "a\0b"}, field="backends.b", source="f.yaml")
    assert str(err.value) == "f.yaml, field 'backends.b.root': a path must not contain a NUL byte"
