"""The alias bomb through a running daemon's reload (issue #36 point 1): ``hetero-dp run
simulated --config FILE`` in a subprocess, registered with a fake kubelet; the
476-byte bomb is written over its config file (the file watcher reloads it, no
SIGHUP). It grew the daemon from 48 MB to 1.7 GB, stopped /readyz and health updates,
and SIGTERM no longer ended it. Now: rejected within 2 s, the old config kept, the
daemon's peak RSS under 400 MiB, Allocate answering meanwhile, SIGTERM ends it."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from hetero_dp.testing import FakeKubelet, short_tempdir
from tests.fuzz.test_yaml_bounds import alias_bomb
from tests.ops.test_run_e2e import LogTail

SIM = "hetero-dp.io/sim"


def peak_rss_kib(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM, /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


async def test_the_bomb_written_over_the_config_is_rejected_at_once(
    tmp_path: Path, repo_root: Path, cli_env: dict[str, str]
) -> None:
    root = short_tempdir("hdp-bomb-")
    kubelet = FakeKubelet(root / "dp")
    kubelet.plugin_dir.mkdir(parents=True)
    await kubelet.start()
    config = tmp_path / "config.yaml"
    config.write_text(f"kubeletDir: {kubelet.plugin_dir}\nhealthInterval: 5\n")
    env = dict(cli_env)
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), str(repo_root / "vendors/simulated")])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hetero_dp", "run", "simulated", "--config", str(config),
        "-o", "simulated.count=2", "--rediscover-interval", "0",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    logs = LogTail(proc.stderr)
    try:
        await kubelet.wait_registered(SIM, timeout=30)
        await kubelet.wait_devices(SIM, lambda d: len(d) == 2)
        assert (await kubelet.allocate(SIM, ["sim0"])) is not None

        started = time.monotonic()
        config.write_text(alias_bomb())  # in place, as 'cp bomb.yaml config.yaml' does
        answered = await kubelet.allocate(SIM, ["sim1"], timeout=5)  # while it reloads
        assert answered is not None
        line = await logs.wait("config reload rejected", timeout=20)
        took = time.monotonic() - started
        assert "keeping the old config" in line and "stands for more than" in line, line
        assert took < 2.0, f"rejected after {took:.2f} s"
        assert peak_rss_kib(proc.pid) < 400 * 1024, f"peak RSS {peak_rss_kib(proc.pid)} KiB"
        assert (await kubelet.allocate(SIM, ["sim0"], timeout=5)) is not None

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    except AssertionError as e:
        raise AssertionError(f"{e}\ndaemon log:\n" + "\n".join(logs.lines)) from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await logs.close()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
