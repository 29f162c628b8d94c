"""The usage hook's record and how the engine checks what the hook returns."""

from __future__ import annotations

import math

import pytest

import hetero_dp
from hetero_dp import ProcessUsage, Sample
from hetero_dp.engine import results
from hetero_dp.model.errors import BackendError


def test_process_usage_is_public_and_figures_may_be_unknown():
    assert hetero_dp.ProcessUsage is ProcessUsage
    u = ProcessUsage("gpu0", 42)
    assert (u.memory_bytes, u.utilization) == (None, None)
    assert ProcessUsage("gpu0", 42, 1 << 30, 0.5).utilization == 0.5


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"device": "", "pid": 1}, "device"),
        ({"device": "g", "pid": 0}, "pid"),
        ({"device": "g", "pid": True}, "pid"),
        ({"device": "g", "pid": "12"}, "pid"),
        ({"device": "g", "pid": 1, "memory_bytes": -1}, "memory_bytes"),
        ({"device": "g", "pid": 1, "memory_bytes": 1.5}, "memory_bytes"),
        ({"device": "g", "pid": 1, "utilization": 1.01}, "utilization"),
        ({"device": "g", "pid": 1, "utilization": math.nan}, "utilization"),
        ({"device": "g", "pid": 1, "utilization": 50}, "utilization"),
    ],
)
def test_a_bad_figure_is_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"ProcessUsage.{field}"):
        ProcessUsage(**kwargs)


def test_the_usage_hook_must_return_process_usage_records():
    assert results.process_usages("acme", "usage", None) == []
    assert (
        results.process_usages("acme", "usage", (ProcessUsage("a", 1) for _ in range(2)))
        == [ProcessUsage("a", 1)] * 2
    )
    with pytest.raises(BackendError, match="usage returned items that are not ProcessUsage"):
        results.process_usages("acme", "usage", [ProcessUsage("a", 1), {"pid": 2}])
    with pytest.raises(BackendError, match="expected an iterable of ProcessUsage"):
        results.process_usages("acme", "usage", 3)


def test_a_sample_may_say_which_device_or_process_it_measures():
    s = Sample("X", 1.0)
    assert (s.device_id, s.pid) == ("", None)
    assert Sample("X", 1.0, {"gpu": "0"}, device_id="GPU-1").device_id == "GPU-1"
    assert Sample("X", 1.0, pid=7).pid == 7
