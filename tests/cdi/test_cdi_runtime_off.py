"""A CDI delivery on a node whose container runtime has CDI off falls back to device specs,
with a warning, instead of starting pods without their device nodes in silence.

containerd 1.6 (Debian 12's package) has no CDI, and 1.7 needs ``enable_cdi = true`` under
``[plugins."io.containerd.grpc.v1.cri"]`` (containerd docs/cri/config.md); there a
``cdi-cri`` answer starts the container with the env but none of the device nodes.
The daemon reads the runtime's config (``cdi.runtimeConfig``, the chart mounts it
read-only) as ``doctor`` does."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.cdi.test_cdi_e2e import RES, Acme

CONTAINERD_16 = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
"""
CONTAINERD_17_CDI = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
"""


@pytest.fixture
def runtime_config(tmp_path: Path):
    def write(text: str, name: str = "config.toml") -> Path:
        path = tmp_path / "host" / "etc" / "containerd" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return write


async def test_cdi_off_falls_back_to_device_specs_with_a_warning(
    fake_kubelet, plugin_runner, tmp_path, runtime_config, caplog
):
    caplog.set_level(logging.WARNING)
    cdi_dir = tmp_path / "cdi"
    config = runtime_config(CONTAINERD_16)
    await plugin_runner.start(
        Acme(2),
        config={
            "cdi": {"enabled": True, "dir": str(cdi_dir), "runtimeConfig": str(config)},
            "resources": {RES: {"deliver": ["cdi-cri"]}},
        },
    )
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    r = await fake_kubelet.allocate(RES, ["accel1"])
    assert list(r.cdi_devices) == []
    assert [d.host_path for d in r.devices] == ["/dev/accel/accel1", "/dev/accel-ctl"]
    assert [m.host_path for m in r.mounts] == ["/opt/acme/lib"]
    warned = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any(
        "delivery cdi-cri needs CDI, but containerd has CDI off" in m and str(config) in m
        for m in warned
    ), warned


async def test_cdi_on_keeps_the_cdi_delivery(fake_kubelet, plugin_runner, tmp_path, runtime_config):
    cdi_dir = tmp_path / "cdi"
    config = runtime_config(CONTAINERD_17_CDI)
    await plugin_runner.start(
        Acme(2),
        config={
            "cdi": {"enabled": True, "dir": str(cdi_dir), "runtimeConfig": str(config)},
            "resources": {RES: {"deliver": ["cdi-cri"]}},
        },
    )
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    r = await fake_kubelet.allocate(RES, ["accel1"])
    assert [c.name for c in r.cdi_devices] == ["acme.com/accel=accel1"]
    assert list(r.devices) == []


def test_docker_without_the_cdi_feature_is_cdi_off(tmp_path: Path):
    from hetero_dp.ops.doctor.runtime import runtime_cdi_off

    daemon_json = tmp_path / "etc" / "docker" / "daemon.json"
    daemon_json.parent.mkdir(parents=True)
    daemon_json.write_text('{"features": {"cdi": false}}')
    assert "docker has CDI off" in (runtime_cdi_off(daemon_json) or "")
    daemon_json.write_text('{"features": {"cdi": true}}')
    assert runtime_cdi_off(daemon_json) is None
    assert runtime_cdi_off(tmp_path / "missing.toml") is None  # unknown: nothing assumed


async def test_a_reload_to_a_runtime_config_with_cdi_on_delivers_with_cdi(
    fake_kubelet, plugin_runner, tmp_path, runtime_config
):
    """``cdi.runtimeConfig`` changed by a reload (the file rewritten on disk) from
    containerd 1.6 (CDI off) to a 1.7 config with ``enable_cdi = true``: Allocate
    answers with CDI names from then on, and back with device specs when it changes
    back. Before, the runtime config was read only at start: the reload said
    "applied" and Allocate kept falling back."""
    import yaml

    from hetero_dp.engine.config import load_config
    from hetero_dp.ops.reload import ConfigReloader

    cdi_dir = tmp_path / "cdi"
    off, on = runtime_config(CONTAINERD_16), runtime_config(CONTAINERD_17_CDI, "cdi.toml")
    doc = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "pluginsRegistryDir": str(fake_kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "cdi": {"enabled": True, "dir": str(cdi_dir), "runtimeConfig": str(off)},
        "resources": {RES: {"deliver": ["cdi-cri"]}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    daemon = await plugin_runner.start(Acme(2), config=doc)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    r = await fake_kubelet.allocate(RES, ["accel1"])
    assert list(r.cdi_devices) == [] and len(r.devices) == 2
    reloader = ConfigReloader(daemon, path, lambda: load_config(path, env={}))
    reloader.start()
    try:
        doc["cdi"]["runtimeConfig"] = str(on)
        path.write_text(yaml.safe_dump(doc))
        results = await reloader.wait_results(1)
        assert results[0].startswith("applied"), results
        r = await fake_kubelet.allocate(RES, ["accel1"])
        assert [c.name for c in r.cdi_devices] == ["acme.com/accel=accel1"]
        assert list(r.devices) == []

        doc["cdi"]["runtimeConfig"] = str(off)
        path.write_text(yaml.safe_dump(doc))
        results = await reloader.wait_results(2)
        assert results[1].startswith("applied"), results
        r = await fake_kubelet.allocate(RES, ["accel1"])
        assert list(r.cdi_devices) == [] and len(r.devices) == 2
    finally:
        await reloader.stop()
