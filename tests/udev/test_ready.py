"""``udev.expect`` and readiness, under umockdev (real libudev through pyudev): a
resource ``expect`` names written out (no glob) holds /readyz and the ready file back
until a device of it is found, here by hotplug; a glob (the default ``["*"]``) never
does, so a DaemonSet whose rules cover hardware some nodes lack stays ready there.

Why (issue 37, seen on a real node): a new pod whose rules found nothing was ready,
so a surge roll of a rules typo stopped the working pod; the node went to 0."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hetero_dp_udev import UdevBackend
from hetero_dp_udev.testing import Testbed

from hetero_dp import ConfigError
from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir
from tests.ops.helpers import http_get, port_of, wait_until

from .test_hotplug import NEW_GPU

pytestmark = pytest.mark.umockdev

AMD = "amd.com/gpu"
WHY = f"{AMD}: not ready: no device found, and backend 'udev' requires one: udev.expect names it"


@pytest.fixture
async def kubelet() -> AsyncIterator[FakeKubelet]:
    root = short_tempdir("hdp-udev-")
    try:
        async with FakeKubelet(root / "dp") as fake:
            yield fake
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def runner(kubelet: FakeKubelet) -> AsyncIterator[PluginRunner]:
    plugins = PluginRunner(kubelet.plugin_dir)
    try:
        yield plugins
    finally:
        await plugins.stop_all()


def _config(tmp_path: Path) -> dict[str, object]:
    return {"metrics": {"address": "127.0.0.1:0", "readyFile": str(tmp_path / "ready")}}


async def test_an_expected_resource_holds_readiness_until_hotplug_brings_it(
    testbed: Testbed, kubelet: FakeKubelet, runner: PluginRunner, tmp_path: Path
) -> None:
    daemon = await runner.start(
        UdevBackend(),
        config=_config(tmp_path),
        options={"udev": {"rules": ["amd-gpu"], "expect": [AMD]}},
    )
    ready_file = tmp_path / "ready"
    status, body = await http_get(port_of(daemon), "/readyz")
    assert (status, body) == (503, WHY + "\n")
    assert not ready_file.exists()

    testbed.add(NEW_GPU)  # the GPU appears: a uevent, a rediscovery, a registration
    await kubelet.wait_registered(AMD, timeout=15)
    await wait_until(daemon, ready_file.exists, timeout=15)
    status, body = await http_get(port_of(daemon), "/readyz")
    assert (status, body) == (200, f"{AMD}: ready (1 devices)\n")


@pytest.mark.parametrize("expect", [["*"], ["amd.com/*"], []])
async def test_a_glob_or_nothing_expected_never_holds_readiness(
    testbed: Testbed, runner: PluginRunner, tmp_path: Path, expect: list[str]
) -> None:
    daemon = await runner.start(
        UdevBackend(),
        config=_config(tmp_path),
        options={"udev": {"rules": ["amd-gpu"], "expect": expect}},
    )
    assert daemon.readiness() == (True, ["no resources: no backend found devices"])
    await wait_until(daemon, (tmp_path / "ready").exists)


def test_an_expected_name_no_rule_advertises_is_refused() -> None:
    from hetero_dp_udev.backend import options

    with pytest.raises(ConfigError, match=r"did you mean 'amd.com/gpu'\?") as e:
        UdevBackend().configure(options({"rules": ["amd-gpu"], "expect": ["amd.com/gpus"]}))
    assert e.value.field == "backends.udev.expect[0]"


def test_doctor_says_an_empty_rule_of_a_named_resource_keeps_the_plugin_unready(
    testbed: Testbed,
) -> None:
    from hetero_dp_udev.backend import options

    def said(expect: list[str]) -> tuple[str, str]:
        checks = UdevBackend().doctor(options({"rules": ["amd-gpu"], "expect": expect}))
        return next((c.status, c.message) for c in checks if c.name == f"{AMD} devices")

    assert said([AMD]) == (
        "warn",
        f"shipped rule set 'amd-gpu': resources[0] ({AMD}) matches no device; {AMD} is "
        "named in udev.expect, so the plugin is not ready until some rule finds one",
    )
    assert said(["amd.com/*"]) == (
        "warn",
        f"shipped rule set 'amd-gpu': resources[0] ({AMD}) matches no device",
    )
