"""Which Python the Makefile installs into (``make -n``: commands shown, none run).

The README's ``make demo`` / ``make test`` must work on a fresh machine: in an activated
venv, with an interpreter named by PYTHON=, and otherwise in ./.venv made on first use,
never the system Python (PEP 668 refuses it on Debian 12 / Ubuntu 24.04).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(*args: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHON", "MAKEFLAGS")}
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_without_a_venv_it_makes_one_and_uses_it(tmp_path: Path):
    venv = tmp_path / "venv"
    out = dry_run(f"VENV={venv}", "BASE_PYTHON=python3.99", "install")
    assert f"python3.99 -m venv {venv}" in out
    assert f"{venv}/bin/python -m pip install" in out
    assert "\npython3 -m pip" not in "\n" + out


def test_an_activated_venv_is_used_as_it_is(tmp_path: Path):
    out = dry_run("install", VIRTUAL_ENV=str(tmp_path / "active"))
    assert f"{tmp_path}/active/bin/python -m pip install" in out
    assert "-m venv" not in out


def test_python_given_on_the_command_line_is_used_as_it_is():
    out = dry_run("PYTHON=/opt/py/bin/python3", "demo")
    assert "/opt/py/bin/python3 -m pip install" in out
    assert "/opt/py/bin/python3 -m hetero_dp demo" in out
    assert "-m venv" not in out
