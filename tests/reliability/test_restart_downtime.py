"""Kubelet restarts as a real kubelet does them (docs/sources.md#kubelet-restart): down for
seconds with its dead ``kubelet.sock`` refusing every ``Register``, then, in one
instant, the plugin's socket deleted and a fresh ``kubelet.sock`` bound. The
plugin is in registration backoff when both signals arrive together; on CPython
3.10/3.11 ``asyncio.wait_for`` could swallow the restart's cancellation there and
leave the plugin unregistered for good, and SIGTERM hanging."""

from __future__ import annotations

import asyncio
import signal

import pytest

from .conftest import SIM, simulated, spawn_simulated

# Downtimes from none to 5 s: each lands at a different point of the plugin's
# registration backoff (50 ms doubling to 5 s), so some land mid-wait, some
# right after a failed attempt.
QUICK_DOWNTIMES = (0.0, 0.12, 0.4, 1.3, 3.1)
STORM_DOWNTIMES = (0.0, 0.05, 0.2, 0.75, 1.55, 2.0, 3.15, 4.0, 5.0, 0.3, 3.0, 5.0)


async def _restart_with_downtime(kubelet, downtime: float, count: int) -> None:
    before = kubelet.registration_count(SIM)
    await kubelet.restart(downtime=downtime)
    await kubelet.wait_registered(SIM, after=before, timeout=15)
    await kubelet.wait_for(
        lambda: kubelet.resources[SIM].stream_open and kubelet.resources[SIM].allocatable == count,
        timeout=15,
    )


@pytest.mark.parametrize("mode", ["classic", "watcher"])
async def test_restarts_with_downtime_reregister(fake_kubelet, plugin_runner, mode):
    daemon = await plugin_runner.start(
        simulated(),
        config={"registration": mode, "streamTimeout": 60},
        options={"simulated": {"count": 2}},
    )
    await fake_kubelet.wait_registered(SIM)
    for downtime in QUICK_DOWNTIMES:
        await _restart_with_downtime(fake_kubelet, downtime, 2)
    resp = await fake_kubelet.allocate(SIM, ["sim1"])
    assert resp.envs["SIM_VISIBLE_DEVICES"] == "1"
    # stopping after the storm is prompt: nothing waits on a task it cancelled
    await asyncio.wait_for(plugin_runner.stop(daemon), 5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["classic", "watcher"])
async def test_restart_storm_with_downtime(fake_kubelet, plugin_runner, mode):
    daemon = await plugin_runner.start(
        simulated(),
        config={"registration": mode, "streamTimeout": 60},
        options={"simulated": {"count": 2}},
    )
    await fake_kubelet.wait_registered(SIM)
    for downtime in STORM_DOWNTIMES:
        await _restart_with_downtime(fake_kubelet, downtime, 2)
    await asyncio.wait_for(plugin_runner.stop(daemon), 5)


@pytest.mark.parametrize("phase", ["down", "backoff", "just-back"])
async def test_sigterm_during_a_restart_ends_within_5s(fake_kubelet, daemon_env, tmp_path, phase):
    """SIGTERM while the kubelet is down (the plugin retrying), while a restart lands
    in the plugin's backoff, or right as the kubelet comes back: exit 0 within 5 s."""
    log = tmp_path / "daemon.log"
    proc = await spawn_simulated(fake_kubelet.plugin_dir, daemon_env, log, 2)
    try:
        await fake_kubelet.wait_registered(SIM, timeout=30)
        before = fake_kubelet.registration_count(SIM)
        if phase == "down":
            restart = asyncio.ensure_future(fake_kubelet.restart(downtime=3.0))
            await fake_kubelet.wait_for(lambda: fake_kubelet.down, timeout=5)
            await fake_kubelet.wait_for(lambda: "attempt 2" in log.read_text(), timeout=5)
        elif phase == "backoff":
            restart = asyncio.ensure_future(fake_kubelet.restart(downtime=1.2))
            await restart
            await fake_kubelet.wait_registered(SIM, after=before, timeout=15)
        else:
            restart = asyncio.ensure_future(fake_kubelet.restart(downtime=0.5))
            await restart
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 5) == 0, log.read_text()[-3000:]
        await restart
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
