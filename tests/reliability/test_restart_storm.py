"""Kubelet restart storms: every restart ends re-registered and streaming, and the
process does not grow (file descriptors, threads, memory) with the restarts."""

from __future__ import annotations

import asyncio

import pytest

from .conftest import SIM, simulated, vitals

# grpc's C core keeps a few lazily created fds and threads; more than this is a leak
FD_SLACK = 4
THREAD_SLACK = 2
RSS_SLACK_MIB = 8.0


async def _restart(kubelet, count):
    before = kubelet.registration_count(SIM)
    await kubelet.restart()
    await kubelet.wait_registered(SIM, after=before, timeout=15)
    # the latest registration streams every device (in watcher mode the kubelet may
    # first register through the old registration socket, replaced a moment later)
    await kubelet.wait_for(
        lambda: kubelet.resources[SIM].stream_open and kubelet.resources[SIM].allocatable == count,
        timeout=15,
    )


async def _storm(fake_kubelet, plugin_runner, restarts):
    daemon = await plugin_runner.start(simulated(), options={"simulated": {"count": 4}})
    await fake_kubelet.wait_registered(SIM)
    warm_up = max(5, restarts // 10)  # grpc and the allocator settle in the first few
    for _ in range(warm_up):
        await _restart(fake_kubelet, 4)
    base = vitals()
    for _ in range(restarts - warm_up):
        await _restart(fake_kubelet, 4)
    end = vitals()
    assert end.fds <= base.fds + FD_SLACK, (base, end)
    assert end.threads <= base.threads + THREAD_SLACK, (base, end)
    assert end.rss_mib <= base.rss_mib + RSS_SLACK_MIB, (base, end)
    # one registration per restart (coalesced), plus the first
    assert fake_kubelet.registration_count(SIM) <= 2 * restarts + 1
    assert fake_kubelet.rejections == []
    # and it still serves after the storm
    resp = await fake_kubelet.allocate(SIM, ["sim1", "sim3"])
    assert resp.envs["SIM_VISIBLE_DEVICES"] == "1,3"
    return daemon


async def test_restart_storm_short(fake_kubelet, plugin_runner):
    await _storm(fake_kubelet, plugin_runner, 25)


@pytest.mark.slow
async def test_restart_storm_200(fake_kubelet, plugin_runner):
    await _storm(fake_kubelet, plugin_runner, 200)


async def test_restart_storm_watcher_mode(fake_kubelet, plugin_runner):
    """The same in watcher mode: the kubelet finds the plugin through plugins_registry."""
    await plugin_runner.start(
        simulated(), config={"registration": "watcher"}, options={"simulated": {"count": 2}}
    )
    await fake_kubelet.wait_registered(SIM)
    assert fake_kubelet.registrations == [(SIM, "watcher")]
    for _ in range(10):
        await _restart(fake_kubelet, 2)
    assert {mode for _, mode in fake_kubelet.registrations} == {"watcher"}
    # the kubelet's first walk of plugins_registry may catch the old registration
    # socket as the plugin replaces it; the new socket's creation registers it then
    assert all(r.startswith("GetInfo on") for r in fake_kubelet.rejections)


async def test_stream_drop_storm_stays_flat(fake_kubelet, plugin_runner):
    """Streams dropped over and over: each time the plugin re-registers, and nothing
    accumulates (servers, channels, watchdog tasks)."""
    daemon = await plugin_runner.start(
        simulated(), config={"streamTimeout": 0.05}, options={"simulated": {"count": 2}}
    )
    await fake_kubelet.wait_registered(SIM)

    async def drop_and_recover():
        before = fake_kubelet.registration_count(SIM)
        await fake_kubelet.drop_stream(SIM)
        await fake_kubelet.wait_registered(SIM, after=before, timeout=15)
        await fake_kubelet.wait_devices(SIM, lambda d: len(d) == 2)

    for _ in range(5):
        await drop_and_recover()
    base = vitals()
    tasks_before = len(asyncio.all_tasks())
    for _ in range(30):
        await drop_and_recover()
    end = vitals()
    assert end.fds <= base.fds + FD_SLACK, (base, end)
    assert end.threads <= base.threads + THREAD_SLACK, (base, end)
    assert len(asyncio.all_tasks()) <= tasks_before + 2
    # the kubelet stays up: each drop is answered by registering again on the same
    # socket (a hand-over, backing off as drops repeat), not by restarting the server
    assert daemon.front_end.endpoints[SIM].restarts == 0
    assert fake_kubelet.registration_count(SIM) == 36
