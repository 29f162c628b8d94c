"""The test kit: a fake kubelet and helpers to run a plugin against it.

Plugin authors get the ``fake_kubelet`` and ``plugin_runner`` pytest fixtures
automatically (entry point ``pytest11``) once hetero-dp is installed.
"""

from __future__ import annotations

from hetero_dp.testing.fake_kubelet import (
    AdmissionError,
    FakeDevice,
    FakeKubelet,
    FakeResource,
    HealthPoint,
)
from hetero_dp.testing.runner import PluginRunner, short_tempdir

__all__ = [
    "AdmissionError",
    "FakeDevice",
    "FakeKubelet",
    "FakeResource",
    "HealthPoint",
    "PluginRunner",
    "short_tempdir",
]
