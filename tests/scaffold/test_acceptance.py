"""Acceptance: a generated project installs, its own tests pass, and ``hetero-dp run``
of it (as a file, and through its entry point once installed in a fresh venv from
built wheels alone) registers with a fake kubelet over real unix sockets."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_dp.cli import scaffold
from hetero_dp.testing import FakeKubelet

from .conftest import VALUES, clean_env, subprocess_env

RESOURCE = "acme.example.com/npu"


def run(
    args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=env or subprocess_env(), capture_output=True, text=True, timeout=300
    )


def test_generated_tests_pass(project: Path):
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


async def serve_and_check(
    cmd: list[str], fake_kubelet: FakeKubelet, devs: Path, env: dict[str, str], cwd: Path
):
    """Run ``CMD run acme_npu-ish`` in a child process until it registers and allocates."""
    # `hetero-dp run` takes only device nodes (the container gate): each fake node is a
    # link to /dev/null, a character device, in a dev dir as a driver root's are
    devs = devs / "dev"
    devs.mkdir()
    for i in range(2):
        os.symlink("/dev/null", devs / f"acme{i}")
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        "--kubelet-dir",
        str(fake_kubelet.plugin_dir),
        "-o",
        f"acme_npu.deviceGlob={devs}/acme*",
        env=env,
        cwd=cwd,
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
    cmd = [sys.executable, "-m", "hetero_dp", "run", str(project / "acme_npu.py")]
    await serve_and_check(cmd, fake_kubelet, tmp_path, subprocess_env(), tmp_path)


async def test_project_installs_from_wheels_alone_and_registers(
    built_wheels: Path, fake_kubelet, tmp_path: Path
):
    """A user outside this repository: ``hetero-dp new --wheels`` puts the built wheel in
    the project, a fresh venv (no system site-packages) installs the project from
    wheels alone (``--no-index --only-binary :all:``), its own tests pass there, and
    its entry point registers with the fake kubelet."""
    project, _ = scaffold.generate(VALUES, tmp_path / "proj", wheels=built_wheels)
    [wheel] = (project / "wheels").glob("hetero_dp-*.whl")
    assert wheel.read_bytes() == next(built_wheels.glob("hetero_dp-*.whl")).read_bytes()
    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    python, env, away = str(venv / "bin" / "python"), clean_env(venv), tmp_path / "elsewhere"
    away.mkdir()
    outside = "import sys; print([p for p in sys.path if 'packages' in p and sys.prefix not in p])"
    cfg = run([python, "-c", outside], env=env)
    assert cfg.stdout.strip() == "[]", cfg.stdout + cfg.stderr
    # The air-gapped path of docs/install.md: third-party wheels fetched once from the
    # index into a wheelhouse; then the install uses no index at all, only wheels (the
    # project itself is built by setuptools from the wheelhouse).
    wheelhouse = tmp_path / "wheelhouse"
    need = [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:"]
    need += ["--dest", str(wheelhouse), "--find-links", "wheels", ".[test]", "setuptools>=77"]
    fetched = run(need, cwd=project)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    pip = [python, "-m", "pip", "install", "-q", "--no-index", "--only-binary", ":all:"]
    pip += ["--find-links", "wheels", "--find-links", str(wheelhouse)]
    installed = run([*pip, ".[test]"], cwd=project, env=env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    where = run([python, "-c", "import hetero_dp; print(hetero_dp.__file__)"], cwd=away, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout + where.stderr

    tests = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project, env=env)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "4 passed" in tests.stdout

    found = run(
        [
            python,
            "-c",
            "from importlib.metadata import entry_points as e;"
            "print({x.name: x.value for x in e(group='hetero_dp')})",
        ],
        cwd=away,
        env=env,
    )
    assert "'acme_npu': 'acme_npu:plugin'" in found.stdout, found.stdout + found.stderr
    devs = tmp_path / "devs"
    devs.mkdir()
    cmd = [str(venv / "bin" / "hetero-dp"), "run", "acme_npu"]
    await serve_and_check(cmd, fake_kubelet, devs, env, away)

    # Installed from that wheel file by name (pip records it: PEP 610 direct_url.json),
    # `hetero-dp new` copies the wheel into the next project and prints no build step.
    again = run([*pip, "--force-reinstall", "--no-deps", str(wheel)], cwd=away, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    new = [str(venv / "bin" / "hetero-dp"), "new", "--output", str(tmp_path / "second")]
    new += ["--vendor-domain", "acme.example.com", "--resource", "npu", "--device-glob", "/d*"]
    made = run(new, cwd=away, env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    [copied] = (tmp_path / "second" / "wheels").glob("hetero_dp-*.whl")
    assert copied.read_bytes() == wheel.read_bytes()
    assert "pip wheel" not in made.stdout and "pip install --find-links wheels" in made.stdout


def printed_steps(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    return [ln.strip() for ln in lines[lines.index("next:") + 1 :]]


def test_printed_next_steps_work_as_printed_without_wheels(tmp_path: Path):
    """The tutorial's step 5 from a source checkout, no --wheels: the printed commands,
    pasted into a shell with no venv active, take the project to passing tests (the
    first builds hetero-dp's wheel from the checkout: no index serves it)."""
    new = [sys.executable, "-m", "hetero_dp", "new", "--output", str(tmp_path / "proj")]
    new += ["--vendor-domain", "acme.example.com", "--resource", "card", "--device-glob", "/d*"]
    made = run(new, cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    steps = printed_steps(made.stdout)
    assert steps[0] == f"cd {tmp_path / 'proj'}" and steps[-1] == "pytest"
    assert any(s.startswith("pip wheel --no-deps --wheel-dir wheels ") for s in steps), steps
    drop = ("HETERO_DP_", "PYTHON", "VIRTUAL_ENV", "PYTEST_ADDOPTS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    ours = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != ours)
    shell = subprocess.run(
        ["bash", "-e", "-c", "\n".join(steps)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert shell.returncode == 0, shell.stdout + shell.stderr
    assert "4 passed" in shell.stdout
    readme = (tmp_path / "proj" / "README.md").read_text()
    assert readme.startswith("# acme.example.com/card device plugin\n")
