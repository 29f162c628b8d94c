"""Rolling the DaemonSet of the udev backend, in both orders, under umockdev (real
libudev through pyudev): the same checks as tests/reliability/test_upgrade.py for
the other bundled backends (see tests/reliability/upgrade.py), with the pods in the
host network as deploy/udev/daemonset.yaml runs them: one metrics port for both
instances, readiness from each pod's own ready file."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hetero_dp_udev import UdevBackend
from hetero_dp_udev.testing import Testbed

from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir
from tests.reliability.upgrade import ORDERS, HostNetwork, check, roll

pytestmark = pytest.mark.umockdev

AMD = "amd.com/gpu"


@pytest.fixture
async def kubelet() -> AsyncIterator[FakeKubelet]:
    root = short_tempdir("hdp-udev-")
    try:
        async with FakeKubelet(root / "dp") as fake:
            yield fake
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("order", ORDERS)
async def test_upgrade_udev(
    testbed: Testbed, data: Path, kubelet: FakeKubelet, order: str, tmp_path: Path
) -> None:
    testbed.add_file(data / "amd-gpu.umockdev")
    runner = PluginRunner(kubelet.plugin_dir)
    net = HostNetwork(tmp_path)

    async def start():  # type: ignore[no-untyped-def]
        return await runner.start(
            UdevBackend(), config=net.config(), options={"udev": {"rules": ["amd-gpu"]}}
        )

    try:
        rollout = await roll(kubelet, runner, start, AMD, 2, order, ready=net.ready)
        check(rollout, kubelet, AMD, 2)
        await net.check(rollout)
    finally:
        await runner.stop_all()
