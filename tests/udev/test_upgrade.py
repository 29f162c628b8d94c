"""Rolling the DaemonSet of the udev backend, in both orders, under umockdev (real
libudev through pyudev): the same checks as tests/reliability/test_upgrade.py for
the other bundled backends (see tests/reliability/upgrade.py)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hetero_dp_udev import UdevBackend
from hetero_dp_udev.testing import Testbed

from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir
from tests.reliability.upgrade import ORDERS, check, roll

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
async def test_upgrade_udev(testbed: Testbed, data: Path, kubelet: FakeKubelet, order: str) -> None:
    testbed.add_file(data / "amd-gpu.umockdev")
    runner = PluginRunner(kubelet.plugin_dir)

    async def start():  # type: ignore[no-untyped-def]
        return await runner.start(UdevBackend(), options={"udev": {"rules": ["amd-gpu"]}})

    try:
        rollout = await roll(kubelet, runner, start, AMD, 2, order)
        check(rollout, kubelet, AMD, 2)
    finally:
        await runner.stop_all()
