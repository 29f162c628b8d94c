"""A plugin author's mistakes in hook names and arguments are refused at load, by a
real ``hetero-dp`` process, with the file, the function and the fix."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from hetero_dp.engine.loading import load_backends
from hetero_dp.model.errors import ConfigError

GOOD = """
from hetero_dp import Device, hookimpl

@hookimpl
def discover():
    return [Device("d0", "acme.example.com/npu")]
"""


def _plugin(tmp_path: Path, extra: str, name: str = "typo_plugin.py") -> Path:
    path = tmp_path / name
    path.write_text(GOOD + textwrap.dedent(extra))
    return path


def _list(cmd: list[str], env: dict[str, str], path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cmd, "list", str(path)], env=env, capture_output=True, text=True, timeout=60
    )


def test_misspelt_hook_is_refused_with_the_closest_name(tmp_path, cli_env, hetero_dp_cmd):
    path = _plugin(
        tmp_path,
        """
        @hookimpl
        def check_heath(device):
            return "never called"
        """,
    )
    result = _list(hetero_dp_cmd, cli_env, path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "did you mean check_health?" in result.stderr
    assert f"{path}:" in result.stderr  # the file (and line) of the function
    assert "check_heath" in result.stderr
    assert "Traceback" not in result.stderr
    assert "d0" not in result.stdout  # nothing ran


def test_unknown_argument_is_refused_with_the_closest_name(tmp_path, cli_env, hetero_dp_cmd):
    path = _plugin(
        tmp_path,
        """
        @hookimpl
        def check_health(dev):
            return True
        """,
    )
    result = _list(hetero_dp_cmd, cli_env, path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "argument 'dev' is not an argument of hook check_health" in result.stderr
    assert "did you mean device?" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_hook_with_no_near_name_lists_the_hooks(tmp_path):
    path = _plugin(
        tmp_path,
        """
        @hookimpl
        def frobnicate():
            pass
        """,
    )
    with pytest.raises(ConfigError) as e:
        load_backends([str(path)])
    assert "'frobnicate' is no hook" in str(e.value)
    assert "discover" in str(e.value) and "check_health" in str(e.value)


def test_every_mistake_is_named_at_once(tmp_path):
    path = _plugin(
        tmp_path,
        """
        @hookimpl
        def labls(devices):
            return {}

        @hookimpl
        def allocate(devics, response):
            pass
        """,
    )
    with pytest.raises(ConfigError) as e:
        load_backends([str(path)])
    assert "did you mean labels?" in str(e.value)
    assert "did you mean devices?" in str(e.value)


def test_an_object_plugin_and_unmarked_helpers_are_fine(tmp_path):
    class Plugin:
        from hetero_dp import hookimpl

        @hookimpl
        def discover(self):
            return []

        @hookimpl
        def check_health(self, device, retries=3):  # a default: pluggy never passes it
            return True

        def check_heath(self):  # not marked: a helper, not a hook
            return True

    (backend,) = load_backends([Plugin()])
    assert backend.implements("check_health")
    backend.close()
