"""A plugin started by path is the module a test imports (no second copy), and an
author's test finds its plugin file from any working directory."""

from __future__ import annotations

import importlib
import sys

from tests.conftest import ROOT
from tests.kit.run_pytest import run_pytest

PLUGIN = """
from hetero_dp import Device, hookimpl

CALLS = []


@hookimpl
def discover():
    CALLS.append("discover")
    return [Device("d0", "acme.example.com/npu")]
"""


async def test_a_plugin_started_by_path_is_the_imported_module(
    tmp_path, monkeypatch, fake_kubelet, plugin_runner
):
    path = tmp_path / "counting_plugin.py"
    path.write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "counting_plugin", raising=False)
    module = importlib.import_module("counting_plugin")
    await plugin_runner.start(str(path))
    await fake_kubelet.wait_devices("acme.example.com/npu", lambda d: "d0" in d)
    assert module.CALLS == ["discover"]  # the daemon ran this very module
    assert sys.modules["counting_plugin"] is module


async def test_a_plugin_not_importable_by_name_still_loads(tmp_path, fake_kubelet, plugin_runner):
    path = tmp_path / "not-a-name.py"  # a dash: no import name can reach it
    path.write_text(PLUGIN)
    await plugin_runner.start(str(path))
    await fake_kubelet.wait_devices("acme.example.com/npu", lambda d: "d0" in d)


def test_the_tutorial_test_passes_from_another_directory(tmp_path, cli_env):
    project = tmp_path / "project"
    project.mkdir()
    (project / "acme.py").write_text((ROOT / "docs/examples/acme.py").read_text())
    text = (ROOT / "docs/tutorial.md").read_text()
    block = text[text.index("<!-- test_acme.py") :].split("```python\n", 1)[1].split("```")[0]
    (project / "test_acme.py").write_text(block)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_pytest(
        project / "test_acme.py", root=project, cwd=elsewhere, env=cli_env, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
