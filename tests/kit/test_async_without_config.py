"""An author's async tests run as written, with no pytest config of theirs: pytest-asyncio
in its default strict mode would refuse an unmarked ``async def`` test ("async def
functions are not natively supported"); hetero-dp's pytest plugin marks it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.kit.run_pytest import run_pytest

TESTS = '''
import asyncio

import pytest

RESOURCE = "acme.example.com/npu"
PLUGIN = """
from hetero_dp import Device, hookimpl


@hookimpl
def discover():
    return [Device("npu0", "acme.example.com/npu")]
"""


async def test_plain(fake_kubelet, plugin_runner, tmp_path):
    (tmp_path / "acme_plugin.py").write_text(PLUGIN)
    await plugin_runner.start(str(tmp_path / "acme_plugin.py"))
    devices = await fake_kubelet.wait_devices(RESOURCE, lambda d: len(d) == 1)
    assert list(devices) == ["npu0"]


@pytest.mark.parametrize("n", [1, 2])
async def test_parametrized(n):
    await asyncio.sleep(0)
    assert n in (1, 2)


class TestInAClass:
    async def test_method(self):
        assert asyncio.get_running_loop() is not None


@pytest.mark.asyncio
async def test_already_marked():
    await asyncio.sleep(0)


def test_sync():
    assert True
'''


@pytest.mark.parametrize("config", ["none", "strict", "auto"])
def test_async_tests_run_with_any_or_no_asyncio_mode(tmp_path: Path, cli_env, config: str):
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_author.py").write_text(TESTS)
    if config != "none":
        (project / "pytest.ini").write_text(f"[pytest]\nasyncio_mode = {config}\n")
    result = run_pytest(
        project / "test_author.py", root=project, cwd=project, env=cli_env, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 passed" in result.stdout, result.stdout
    assert "not natively supported" not in result.stdout + result.stderr
    # nor pytest-asyncio's warning about its unset fixture loop scope on every run
    assert "asyncio_default_fixture_loop_scope" not in result.stdout + result.stderr


def test_without_the_plugin_the_same_file_fails_as_the_issue_saw(tmp_path: Path, cli_env):
    """The check above can fail: with hetero-dp's plugin off, strict mode refuses."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_author.py").write_text("async def test_x():\n    pass\n")
    import subprocess

    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hetero_dp"]
    result = subprocess.run(
        [*cmd, "--rootdir", str(project), str(project / "test_author.py")],
        cwd=project,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "not natively supported" in result.stdout + result.stderr
