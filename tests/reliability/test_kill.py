"""The plugin process dies hard (SIGKILL) and is started again: the stale socket it
left behind is cleaned up and it registers again; SIGTERM leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from hetero_dp.model.names import socket_name

from .conftest import SIM

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def daemon_env(cli_env):
    paths = [str(ROOT), str(ROOT / "vendors" / "simulated"), cli_env.get("PYTHONPATH", "")]
    cli_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return cli_env


async def _spawn(kubelet_dir: Path, env, log: Path) -> asyncio.subprocess.Process:
    with open(log, "ab") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "hetero_dp",
            "run",
            "simulated",
            "--kubelet-dir",
            str(kubelet_dir),
            "-o",
            "simulated.count=3",
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stderr=err,
        )


async def _reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


async def test_sigkill_then_restart_cleans_stale_socket(fake_kubelet, daemon_env, tmp_path):
    sock = fake_kubelet.plugin_dir / socket_name("hetero-dp", SIM)
    log = tmp_path / "daemon.log"
    first = await _spawn(fake_kubelet.plugin_dir, daemon_env, log)
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

    second = await _spawn(fake_kubelet.plugin_dir, daemon_env, log)
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
