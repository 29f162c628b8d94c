"""docs/operations.md stays in step with the code: every metric the daemon exports,
every DCGM-named NVIDIA sample and every fixed reload key is named on the page."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from hetero_dp.engine.required import Requirements
from hetero_dp.engine.settings import NEXT_START, REFUSED
from hetero_dp.ops.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs/operations.md").read_text()


def test_every_framework_metric_is_documented():
    daemon = SimpleNamespace(resources={}, runtimes={}, requirements=Requirements({}))
    metrics = Metrics(daemon)  # type: ignore[arg-type]
    try:
        families = list(metrics.registry.collect())
    finally:
        metrics.close()
    names = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    assert len(names) >= 15
    missing = sorted(n for n in names if f"`{n}`" not in PAGE)
    assert not missing, f"docs/operations.md does not name: {missing}"


def test_every_nvidia_sample_name_is_documented():
    source = (ROOT / "vendors/nvidia/hetero_dp_nvidia/metrics.py").read_text()
    names = set(re.findall(r'"(DCGM_FI_[A-Z_]+)"', source))
    assert names
    assert not sorted(n for n in names if f"`{n}`" not in PAGE)


def test_fixed_reload_keys_are_documented():
    assert all(f"`{key}`" in PAGE for key in (*REFUSED, *NEXT_START))
