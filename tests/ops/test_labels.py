"""The Node Feature Discovery label file: generic and backend labels, refreshed on change."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil

import pytest
from hetero_dp_simulated.backend import SimulatedBackend

from hetero_dp import Device, hookimpl
from hetero_dp.kits.inotify import DirectoryWatcher
from hetero_dp.ops.labels import generic_labels, label_problem, label_value, parse
from hetero_dp.testing import short_tempdir
from tests.core.scripted import Scripted, make_devices

SIM = "hetero-dp.io/sim"


@pytest.fixture
def label_dir():
    d = short_tempdir("hdp-lbl-")
    yield d / "features.d"  # created by the writer
    shutil.rmtree(d, ignore_errors=True)


class FileWaiter:
    """Wakes on every (atomic, rename-into-place) write of one file."""

    def __init__(self, directory, name):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / name
        self.changed = asyncio.Event()
        self.watcher = DirectoryWatcher(directory, self._on)
        self.watcher.start()

    def _on(self, name, kind):
        if name == self.path.name:
            self.changed.set()

    async def wait_content(self, predicate, timeout=10.0):
        async def loop():
            while not (self.path.exists() and predicate(parse(self.path.read_text()))):
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(loop(), timeout)
        return parse(self.path.read_text())


async def test_generic_and_backend_labels_follow_the_device_set(
    fake_kubelet, plugin_runner, label_dir
):
    waiter = FileWaiter(label_dir, "hetero-dp-simulated")
    try:
        backend = SimulatedBackend()
        daemon = await plugin_runner.start(
            backend,
            config={"labels": {"enabled": True, "dir": str(label_dir)}},
            options={"simulated": {"count": 4}},
        )
        await fake_kubelet.wait_registered(SIM)
        labels = await waiter.wait_content(lambda lb: f"{SIM}.count" in lb)
        assert labels == {f"{SIM}.count": "4", f"{SIM}.product": "Simulated-Accelerator"}
        text = (label_dir / "hetero-dp-simulated").read_text()
        assert text.endswith("\n") and all("=" in line for line in text.splitlines())
        assert not [
            p for p in label_dir.iterdir() if p.name != "hetero-dp-simulated"
        ]  # no temp files

        backend.set_count(6)
        labels = await waiter.wait_content(lambda lb: lb.get(f"{SIM}.count") == "6")
        assert labels[f"{SIM}.product"] == "Simulated-Accelerator"

        await plugin_runner.stop(daemon)
        assert not (
            label_dir / "hetero-dp-simulated"
        ).exists()  # a stopped plugin advertises nothing
    finally:
        waiter.watcher.close()


class Labelled(Scripted):
    def __init__(self, devices):
        super().__init__(devices)
        self.label_calls = 0

    @hookimpl
    def labels(self, devices: list[Device]) -> dict[str, str]:
        self.label_calls += 1
        return {
            "example.com/accel.count": "99",  # the backend's word wins over the generic one
            "example.com/accel.family": "ampere",
            "example.com/bad label": "x",  # invalid: left out, the rest written
            "example.com/accel.driver": "550.54.15",
        }


async def test_backend_labels_win_invalid_ones_are_dropped_and_health_does_not_rewrite(
    fake_kubelet, plugin_runner, label_dir
):
    res = "example.com/accel"
    waiter = FileWaiter(label_dir, "hetero-dp-scripted")
    try:
        backend = Labelled(make_devices(res, 2))
        daemon = await plugin_runner.start(
            backend, config={"labels": {"enabled": True, "dir": str(label_dir)}}
        )
        labels = await waiter.wait_content(lambda lb: bool(lb))
        assert labels == {
            "example.com/accel.count": "99",
            "example.com/accel.family": "ampere",
            "example.com/accel.driver": "550.54.15",
        }
        calls = backend.label_calls
        backend.unhealthy["dev0"] = "hot"
        await daemon.poll_health()
        await fake_kubelet.wait_devices(res, lambda d: not d["dev0"].healthy)
        assert backend.label_calls == calls  # health is not a label: no new hook call
        backend.devices = make_devices(res, 3)
        await daemon.rediscover()
        assert backend.label_calls == calls + 1
        # the same IDs with other attributes are asked about; equal new records are not
        for n in (2, 2, 3):
            backend.devices = [
                dataclasses.replace(d, attributes={"memoryMiB": 80 * n}) for d in backend.devices
            ]
            await daemon.rediscover()
        assert backend.label_calls == calls + 3
    finally:
        waiter.watcher.close()


def test_label_helpers():
    assert label_value(" NVIDIA A100-SXM4 (80GB) ") == "NVIDIA-A100-SXM4-80GB"
    assert label_problem("nvidia.com/gpu.count", "8") is None
    assert "value" in label_problem("nvidia.com/gpu.product", "has space")
    assert "prefix" in label_problem("Nvidia.com/gpu", "1")
    assert "name part" in label_problem("nvidia.com/" + "x" * 64, "1")
    devices = [
        Device(id=f"d{i}", resource="acme.io/npu", attributes={"product": p})
        for i, p in enumerate(["Acme X1", "Acme X2", "Acme X2"])
    ]
    assert generic_labels("acme.io/npu", devices) == {
        "acme.io/npu.count": "3",
        "acme.io/npu.product": "Acme-X2",
    }
    assert generic_labels("acme.io/npu", []) == {"acme.io/npu.count": "0"}


async def test_two_daemons_on_a_node_keep_their_own_label_files(
    fake_kubelet, plugin_runner, label_dir
):
    config = {"labels": {"enabled": True, "dir": str(label_dir)}}
    sim = await plugin_runner.start(SimulatedBackend(), config=config)
    await plugin_runner.start(Scripted(make_devices("example.com/accel", 3)), config=config)
    await fake_kubelet.wait_registered(SIM)
    await fake_kubelet.wait_registered("example.com/accel")
    assert parse((label_dir / "hetero-dp-simulated").read_text())[f"{SIM}.count"] == "4"
    assert parse((label_dir / "hetero-dp-scripted").read_text()) == {"example.com/accel.count": "3"}
    await plugin_runner.stop(sim)
    assert sorted(p.name for p in label_dir.iterdir()) == ["hetero-dp-scripted"]


async def test_simulated_labels_count_each_resource_it_serves(
    fake_kubelet, plugin_runner, label_dir
):
    other = "hetero-dp.io/sim-b"
    waiter = FileWaiter(label_dir, "hetero-dp-simulated")
    try:
        await plugin_runner.start(
            SimulatedBackend(),
            config={"labels": {"enabled": True, "dir": str(label_dir)}},
            options={"simulated": {"count": 2, "resources": [SIM, other]}},
        )
        await fake_kubelet.wait_registered(other)
        labels = await waiter.wait_content(lambda lb: f"{other}.count" in lb)
    finally:
        waiter.watcher.close()
    assert {k: v for k, v in labels.items() if k.endswith(".count")} == {
        f"{SIM}.count": "2",
        f"{other}.count": "2",
    }
