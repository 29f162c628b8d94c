"""The backend as the framework loads it: the entry point, the hooks pluggy sees."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hetero_dp_udev import UdevBackend, backend, testing

from hetero_dp.engine.loading import load_backends

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomli is hetero-dp's own dependency on 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "vendors" / "udev" / "pyproject.toml"
HOOKS = {"configure", "discover", "check_health", "watch", "labels", "doctor"}


def test_entry_point_names_the_backend_instance() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["name"] == "hetero-dp-udev"
    assert project["entry-points"]["hetero_dp"] == {"udev": "hetero_dp_udev.backend:plugin"}


@pytest.mark.parametrize("plugin", [backend.plugin, UdevBackend()], ids=["entry", "own"])
def test_pluggy_sees_every_hook(plugin: object) -> None:
    (loaded,) = load_backends([plugin])
    assert loaded.name == "udev"
    assert {h for h in HOOKS if loaded.implements(h)} == HOOKS


def test_testbed_refuses_to_start_without_the_preload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", "")
    with pytest.raises(RuntimeError, match="umockdev-wrapper"):
        testing.Testbed()


@pytest.mark.umockdev
def test_testbed_reports_bad_descriptions(testbed: testing.Testbed) -> None:
    with pytest.raises(ValueError, match=r"malformed attribute or property line"):
        testbed.add("P: /devices/x\nQ: what\n")
