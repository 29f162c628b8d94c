"""The plugin process dies hard (SIGKILL) and is started again: the stale socket it
left behind is cleaned up and it registers again; SIGTERM leaves nothing behind."""

from __future__ import annotations

import asyncio
import signal
import stat

from hetero_dp.model.names import socket_name

from .conftest import SIM, spawn_simulated


async def _reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


async def test_sigkill_then_restart_cleans_stale_socket(fake_kubelet, daemon_env, tmp_path):
    # the container restarted in the same pod: the same pod UID names the same socket
    daemon_env["POD_UID"] = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
    sock = fake_kubelet.plugin_dir / socket_name("hetero-dp", SIM, "0a1b2c3d4e5f")
    log = tmp_path / "daemon.log"
    first = await spawn_simulated(fake_kubelet.plugin_dir, daemon_env, log, 3)
    try:
        res = await fake_kubelet.wait_registered(SIM, timeout=30)
        assert res.capacity == 3
        first.send_signal(signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
        # the kubelet sees the stream end and marks everything unhealthy
        await fake_kubelet.wait_for(lambda: not fake_kubelet.resources[SIM].stream_open)
        assert fake_kubelet.resources[SIM].allocatable == 0
    finally:
        await _reap(first)
    assert stat.S_ISSOCK(sock.lstat().st_mode), "a killed process leaves its socket behind"

    second = await spawn_simulated(fake_kubelet.plugin_dir, daemon_env, log, 3)
    try:
        await fake_kubelet.wait_registered(SIM, after=1, timeout=30)
        await fake_kubelet.wait_devices(
            SIM, lambda d: len(d) == 3 and all(x.healthy for x in d.values())
        )
        assert "removed stale socket" in log.read_text()
        resp = await fake_kubelet.allocate(SIM, ["sim2"])
        assert resp.envs["SIM_VISIBLE_DEVICES"] == "2"
        assert fake_kubelet.rejections == []
        second.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(second.wait(), 15) == 0
    finally:
        await _reap(second)
    assert not sock.exists(), "a clean stop removes the socket"
