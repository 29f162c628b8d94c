"""Quick exit (issue 28 point 3): on SIGTERM an idle ``hetero-dp run`` ends its streams,
removes its socket and leaves at once, without the interpreter's finalization (which
took 0.3-0.5 s of a 0.35-0.55 s exit, and in a rolling update that stops the old pod
first the old pod's exit is part of the dip). Timings: benchmarks/bench_upgrade.py."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from .conftest import SIM, spawn_simulated


async def test_sigterm_ends_an_idle_instance_at_once_without_finalization(
    fake_kubelet, daemon_env, tmp_path
):
    # atexit handlers run in the interpreter's finalization: a marker says whether it ran
    site = tmp_path / "site"
    site.mkdir()
    finalized = tmp_path / "finalized"
    (site / "sitecustomize.py").write_text(
        f"import atexit\natexit.register(lambda: open({str(finalized)!r}, 'w').close())\n"
    )
    daemon_env["PYTHONPATH"] = os.pathsep.join([str(site), daemon_env["PYTHONPATH"]])
    proc = await spawn_simulated(fake_kubelet.plugin_dir, daemon_env, tmp_path / "log", 2)
    try:
        await fake_kubelet.wait_registered(SIM, timeout=30)
        res = fake_kubelet.resources[SIM]
        await fake_kubelet.wait_for(lambda: res.stream_open and res.allocatable == 2, 30)
        socket = res.endpoint
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        took = time.monotonic() - started
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    log = (tmp_path / "log").read_text()
    # before: the interpreter's finalization ran after the clean stop
    assert not finalized.exists(), log
    # "well under a second" (the goal, < 0.3 s, is measured by the benchmark: the
    # machine running the suite may be loaded)
    assert took < 1.0, (took, log)
    assert not os.path.exists(socket)
    await fake_kubelet.wait_for(lambda: not res.stream_open, 5)
