"""The NVIDIA backend as a DRA driver (nvidia_case.py), in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("hetero_dp_nvidia")
pytest.importorskip("kubernetes")

CASE = Path(__file__).with_name("nvidia_case.py")
ROOT = Path(__file__).resolve().parents[2]


def test_nvidia_backend_serves_as_a_dra_driver(cli_env):
    # A process of its own: a second fake libnvidia-ml.so.1 loaded next to the one
    # tests/nvidia loads would not be the one pynvml talks to.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASE)],
        cwd=ROOT,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout
