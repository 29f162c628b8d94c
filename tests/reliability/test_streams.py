"""A kubelet that never opens ListAndWatch after Register, or drops it later: the
plugin notices (config ``streamTimeout``) and registers again instead of sitting at
zero allocatable devices ("0 GPUs allocatable")."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from hetero_dp.testing import FakeKubelet, PluginRunner, short_tempdir

from .conftest import SIM, simulated

FAST = {"streamTimeout": 0.2}


async def test_stream_never_opened_then_kubelet_behaves():
    root = short_tempdir()
    kubelet = FakeKubelet(root / "dp", open_streams=False)
    await kubelet.start()
    runner = PluginRunner(kubelet.plugin_dir)
    try:
        daemon = await runner.start(simulated(), config=FAST, options={"simulated": {"count": 2}})
        # registered, but no stream: it must keep trying rather than wait forever
        await kubelet.wait_for(lambda: kubelet.registration_count(SIM) >= 3, timeout=10)
        assert not kubelet.resources[SIM].stream_open
        assert daemon.front_end.endpoints[SIM].restarts >= 2
        # once the kubelet opens streams again, the next registration sticks
        kubelet.open_streams = True
        n = kubelet.registration_count(SIM)
        res = await kubelet.wait_registered(SIM, after=n, timeout=10)
        await kubelet.wait_devices(SIM, lambda d: len(d) == 2)
        assert res.stream_open and res.allocatable == 2
        assert daemon.front_end.session(SIM).ready
    finally:
        await runner.stop_all()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_dropped_stream_is_recovered(fake_kubelet, plugin_runner):
    daemon = await plugin_runner.start(
        simulated(), config=FAST, options={"simulated": {"count": 3}}
    )
    await fake_kubelet.wait_registered(SIM)
    for round_ in range(3):
        n = fake_kubelet.registration_count(SIM)
        await fake_kubelet.drop_stream(SIM)
        assert fake_kubelet.resources[SIM].allocatable == 0  # what users see: 0 allocatable
        res = await fake_kubelet.wait_registered(SIM, after=n, timeout=10)
        await fake_kubelet.wait_devices(SIM, lambda d: len(d) == 3)
        assert res.stream_open and res.allocatable == 3, round_
    # the kubelet is up all along: each time the plugin registers again on the same
    # socket (a hand-over), without restarting its server
    assert daemon.front_end.endpoints[SIM].restarts == 0
    resp = await fake_kubelet.allocate(SIM, ["sim0"])
    assert resp.envs["SIM_VISIBLE_DEVICES"] == "0"


async def test_stream_kept_open_is_left_alone(fake_kubelet, plugin_runner):
    """The watchdog must not re-register while a stream stays open."""
    daemon = await plugin_runner.start(simulated(), config=FAST)
    await fake_kubelet.wait_registered(SIM)
    # nothing may happen for three stream timeouts: waiting for a second registration fails
    with pytest.raises(asyncio.TimeoutError):
        await fake_kubelet.wait_for(lambda: fake_kubelet.registration_count(SIM) > 1, timeout=0.6)
    assert daemon.front_end.endpoints[SIM].restarts == 0
    assert fake_kubelet.resources[SIM].stream_open
