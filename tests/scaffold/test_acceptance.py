"""Acceptance: a generated project installs, its own tests pass, and ``hetero-dp run``
of it (as a file, and through its entry point once installed) registers with a fake
kubelet over real unix sockets."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_dp.testing import FakeKubelet

from .conftest import subprocess_env

RESOURCE = "acme.example.com/npu"


def run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=240
    )


def test_generated_tests_pass(project: Path):
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


async def serve_and_check(python: str, backend: str, fake_kubelet: FakeKubelet, devs: Path):
    """Run ``hetero-dp run BACKEND`` in a child process until it registers and allocates."""
    for i in range(2):
        (devs / f"acme{i}").touch()
    proc = await asyncio.create_subprocess_exec(
        python,
        "-m",
        "hetero_dp",
        "run",
        backend,
        "--kubelet-dir",
        str(fake_kubelet.plugin_dir),
        "-o",
        f"acme_npu.deviceGlob={devs}/acme*",
        env=subprocess_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        registered = asyncio.ensure_future(fake_kubelet.wait_registered(RESOURCE, timeout=60))
        exited = asyncio.ensure_future(proc.wait())
        done, _ = await asyncio.wait({registered, exited}, return_when=asyncio.FIRST_COMPLETED)
        if exited in done:
            registered.cancel()
            out = await proc.stdout.read() if proc.stdout else b""
            pytest.fail(f"hetero-dp run exited {proc.returncode}: {out.decode()}")
        await registered
        devices = await fake_kubelet.wait_devices(RESOURCE, lambda d: len(d) == 2)
        assert sorted(devices) == ["acme0", "acme1"]
        response = await fake_kubelet.allocate(RESOURCE, ["acme1"])
        assert response.envs["ACME_NPU_VISIBLE_DEVICES"] == "acme1"
        assert [d.host_path for d in response.devices] == [str(devs / "acme1")]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(exited, 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_run_of_the_module_file_registers(project: Path, fake_kubelet, tmp_path: Path):
    await serve_and_check(sys.executable, str(project / "acme_npu.py"), fake_kubelet, tmp_path)


async def test_installed_project_registers_through_its_entry_point(
    project: Path, fake_kubelet, tmp_path: Path
):
    # --without-pip: the venv then uses the outer pip and setuptools (a venv's bundled
    # setuptools may be too old to build an editable wheel without the network).
    # An editable install without build isolation builds with the outer setuptools:
    # it needs bdist_wheel, built into setuptools from 70.1 (older ones need `wheel`).
    setuptools = pytest.importorskip("setuptools")
    has_wheel = importlib.util.find_spec("wheel") is not None
    version = tuple(int(p) for p in setuptools.__version__.split(".")[:2])
    assert version >= (70, 1) or has_wheel, "pip install 'setuptools>=70.1' (or wheel)"
    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e"]
    installed = run([*pip, str(project)])
    assert installed.returncode == 0, installed.stdout + installed.stderr
    found = run(
        [
            python,
            "-c",
            "from importlib.metadata import entry_points as e;"
            "print({x.name: x.value for x in e(group='hetero_dp')})",
        ]
    )
    assert "'acme_npu': 'acme_npu'" in found.stdout, found.stdout + found.stderr
    devs = tmp_path / "devs"
    devs.mkdir()
    await serve_and_check(python, "acme_npu", fake_kubelet, devs)
