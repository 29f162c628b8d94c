"""The metrics.address flag over the file, and its errors naming their source."""

from __future__ import annotations

import pytest

from hetero_dp.engine.config import load_config
from hetero_dp.engine.settings import MetricsSection
from hetero_dp.model.errors import ConfigError


def test_flag_overrides_the_files_metrics_address(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("metrics: {address: ':9000'}\nlabels: {enabled: true}\n")
    assert load_config(path, env={}).metrics == MetricsSection(address=":9000")
    cfg = load_config(path, env={}, overrides={"metrics": {"address": "127.0.0.1:9435"}})
    assert cfg.metrics == MetricsSection(address="127.0.0.1:9435")
    assert cfg.labels.enabled is True  # other sections untouched
    cfg = load_config(path, env={}, overrides={"metrics": {"address": None}})
    assert cfg.metrics == MetricsSection(address=":9000")  # an unset flag leaves the file's


def test_the_flag_keeps_the_files_other_metrics_keys(tmp_path):
    """The udev DaemonSet: the address from HETERO_DP_METRICS_ADDRESS (the flag), the
    ready file and the port wait from its config file."""
    path = tmp_path / "c.yaml"
    path.write_text("metrics: {waitForPort: true, readyFile: /run/hetero-dp/ready}\n")
    cfg = load_config(path, env={}, overrides={"metrics": {"address": "10.0.0.7:9435"}})
    assert cfg.metrics == MetricsSection(
        address="10.0.0.7:9435", wait_for_port=True, ready_file="/run/hetero-dp/ready"
    )


def test_bad_flag_value_names_the_flag():
    with pytest.raises(ConfigError, match="flag --metrics") as e:
        load_config(raw={}, env={}, overrides={"metrics": {"address": 9435}})
    assert e.value.field == "metrics.address"
