"""Rolling the DaemonSet of the udev backend, in both orders, under umockdev (real
libudev through pyudev): the same checks as tests/reliability/test_upgrade.py for
the other bundled backends (see tests/reliability/upgrade.py), with the pods in the
host network as deploy/udev/daemonset.yaml runs them: one metrics port for both
instances, readiness from each pod's own ready file."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import hetero_dp_udev
import pytest
from hetero_dp_udev import UdevBackend
from hetero_dp_udev.testing import Testbed

from hetero_dp.ops import operations
from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir
from tests.ops.helpers import wait_until
from tests.reliability.upgrade import ORDERS, HostNetwork, _serving, check, roll

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


async def test_a_surge_roll_of_a_rules_typo_stalls_with_the_old_pod_serving(
    testbed: Testbed, data: Path, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """The roll seen on a real node (docs/walkthrough.md, step 7), with the resource
    in ``udev.expect``: the new pod's rules have a typo and find nothing, so it never
    turns ready (no ready file: the DaemonSet's exec probe fails), so a surge roll
    never stops the old pod, which keeps serving both GPUs; undoing the roll (the
    new pod deleted) leaves the node as it was. Before, the new pod was ready with
    nothing to serve, the old one was stopped, and the node went to allocatable 0."""
    testbed.add_file(data / "amd-gpu.umockdev")
    shipped = Path(hetero_dp_udev.__file__).parent / "rulesets" / "amd-gpu.yaml"
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(shipped.read_text())
    bad.write_text(shipped.read_text().replace('vendor: "0x1002"', 'vendor: "0x1020"'))
    assert bad.read_text() != good.read_text()
    runner = PluginRunner(kubelet.plugin_dir)
    net = HostNetwork(tmp_path)

    async def start(rules: Path):  # type: ignore[no-untyped-def]
        options = {"udev": {"rules": str(rules), "expect": [AMD]}}
        return await runner.start(UdevBackend(), config=net.config(), options=options)

    try:
        old = await start(good)
        old_socket = old.front_end.endpoints[AMD].socket_path
        await kubelet.wait_for(lambda: _serving(kubelet, AMD, old_socket, 2), 30)
        await wait_until(old, lambda: net.ready(old), timeout=10)

        new = await start(bad)  # surge: beside the old one
        await new.rediscover()  # a later look finds nothing either
        ready, lines = new.readiness()
        assert not ready
        assert lines == [
            f"{AMD}: not ready: no device found, and backend 'udev' requires one: "
            "udev.expect names it"
        ]
        ops = operations.of(new)
        assert ops is not None and ops.ready_file is not None
        assert ops.ready_file.update() is False and not net.ready(new)

        # so the old pod is not stopped: the kubelet still gets both GPUs from it
        assert _serving(kubelet, AMD, old_socket, 2)
        ids = await kubelet.admit(AMD, 2)
        kubelet.release(ids)
        await runner.stop(new)  # the roll undone
        assert _serving(kubelet, AMD, old_socket, 2) and net.ready(old)
    finally:
        await runner.stop_all()
