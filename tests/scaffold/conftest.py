"""Helpers for the scaffold tests: render a project, run commands with our branch first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_dp.cli import scaffold

ROOT = Path(__file__).resolve().parents[2]
VALUES = {
    "vendor_domain": "acme.example.com",
    "resource": "npu",
    "device_glob": "/dev/acme*",
}


def subprocess_env() -> dict[str, str]:
    """This checkout's hetero_dp ahead of any installed copy, and none of our env vars."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_DP_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    return env


@pytest.fixture
def project(tmp_path: Path) -> Path:
    out, _ = scaffold.generate(VALUES, tmp_path / "proj")
    return out


@pytest.fixture
def python() -> str:
    return sys.executable


def clean_env(venv: Path) -> dict[str, str]:
    """A user's shell with ``venv`` activated: nothing of this checkout on any path."""
    drop = ("HETERO_DP_", "PYTHON", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="session")
def built_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hetero-dp's sdist and wheel, built from this checkout by ``python -m build``.

    The wheel is built from the sdist (as a package index user's pip would), so a file
    the sdist forgets is missing here too. No build isolation: the dev environment's
    setuptools builds it, so this needs no network.
    """
    pytest.importorskip("build", reason="pip install build (in the dev extra)")
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "-q", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(list(out.glob("hetero_dp-*.whl"))) == 1, sorted(out.iterdir())
    return out
