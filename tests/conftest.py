"""Shared fixtures. The ``fake_kubelet`` and ``plugin_runner`` fixtures come from
hetero-dp's own pytest plugin (entry point ``pytest11``), as for any plugin author.

Over the whole run, tests/hostguard.py fails any test that writes to the host's CDI or
kubelet dirs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The fake libnvidia-ml.so.1 fixtures, for any test directory (one fake NVML per process).
from tests.fakenvml.fixtures import fake_node, fake_nvml_lib, watching  # noqa: F401
from tests.hostguard import HostGuard, TmpGuard

ROOT = Path(__file__).resolve().parent.parent


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    # The namespace first: unshare(2) must come before any thread is started.
    config.pluginmanager.register(HostGuard(private=True), "hetero_dp_host_guard")
    config.pluginmanager.register(TmpGuard(config), "hetero_dp_tmp_guard")


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def cli_env() -> dict[str, str]:
    """Environment for running ``hetero-dp`` in a subprocess, free of our own HETERO_DP_ vars."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_DP_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def hetero_dp_cmd() -> list[str]:
    return [sys.executable, "-m", "hetero_dp"]
