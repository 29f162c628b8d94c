"""Helpers for the scaffold tests: render a project, run commands with our branch first."""

from __future__ import annotations

import os
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
