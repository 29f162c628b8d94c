"""End to end, as the DaemonSets run it: ``hetero-dp run simulated`` in a subprocess, told
where to serve probes and write labels by flags or by the DaemonSets' env vars
(HETERO_DP_METRICS_ADDRESS, HETERO_DP_LABELS_DIR), against a FakeKubelet that starts
only after the daemon does: /readyz answers 503 until the resource registers, then 200;
/metrics shows the devices; the label file appears; a kubelet restart is counted and
readiness comes back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hetero_dp.kits.inotify import DirectoryWatcher
from hetero_dp.ops.labels import parse
from hetero_dp.testing import FakeKubelet, short_tempdir

from .helpers import http_get

SIM = "hetero-dp.io/sim"
LABEL_FILE = "hetero-dp-simulated"  # <socketPrefix>-<backends>


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LogTail:
    """Reads the daemon's stderr as it comes (so the pipe never fills); waits on lines."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.lines: list[str] = []
        self._changed = asyncio.Condition()
        self._task = asyncio.get_running_loop().create_task(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while raw := await stream.readline():
            async with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()

    async def wait(self, text: str, timeout: float = 30.0) -> str:
        def found() -> bool:
            return any(text in line for line in self.lines) or self._task.done()

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(found), timeout)
        for line in self.lines:
            if text in line:
                return line
        raise AssertionError(f"the daemon exited before logging {text!r}: {self.lines}")

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def wait_file(path: Path, timeout: float = 10.0) -> str:
    """Wait (inotify, no polling) until ``path`` exists; return its text."""
    loop = asyncio.get_running_loop()
    appeared = asyncio.Event()
    watcher = DirectoryWatcher(
        path.parent,
        lambda name, kind: loop.call_soon_threadsafe(appeared.set) if name == path.name else None,
    )
    watcher.start()
    try:
        if not path.exists():
            await asyncio.wait_for(appeared.wait(), timeout)
        return path.read_text()
    finally:
        watcher.close()


async def get_until(
    port: int, path: str, want: Callable[[int, str], bool], timeout: float = 20.0
) -> tuple[int, str]:
    """Repeat a GET until ``want(status, body)`` or the deadline: the daemon is another
    process, so its state can only be asked for, not waited on."""
    deadline = time.monotonic() + timeout
    status, body = 0, ""
    while time.monotonic() < deadline:
        status, body = await http_get(port, path)
        if want(status, body):
            return status, body
        await asyncio.sleep(0.05)
    raise AssertionError(f"GET {path}: still {status} {body!r} after {timeout}s")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


@pytest.fixture
async def kubelet_not_started() -> AsyncIterator[FakeKubelet]:
    root = short_tempdir("hdp-e2e-")
    kubelet = FakeKubelet(root / "dp")
    kubelet.plugin_dir.mkdir(parents=True)
    try:
        yield kubelet
    finally:
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("how", ["flags", "env"])
async def test_run_becomes_ready_after_registration_and_writes_labels(
    kubelet_not_started, tmp_path, repo_root, cli_env, how
):
    kubelet = kubelet_not_started
    port = free_port()
    label_dir = tmp_path / "features.d"
    label_dir.mkdir()  # the DaemonSets' hostPath (DirectoryOrCreate) exists before the pod
    where = {
        "kubelet_dir": str(kubelet.plugin_dir),
        "metrics_address": f"127.0.0.1:{port}",
        "labels_dir": str(label_dir),
    }
    env = dict(cli_env)
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), str(repo_root / "vendors/simulated")])
    # The kubelet comes up while the daemon retries: it must register once, promptly,
    # without relying on the stream watchdog (streamTimeout stays at its 30 s default).
    args = ["run", "simulated", "-o", "simulated.count=2"]
    args += ["--health-interval", "0", "--rediscover-interval", "0"]
    for key, val in where.items():
        if how == "flags":
            args += ["--" + key.replace("_", "-"), val]
        else:
            env["HETERO_DP_" + key.upper()] = val
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hetero_dp", *args,
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    logs = LogTail(proc.stderr)
    try:
        await logs.wait(f"serving /metrics, /healthz and /readyz on 127.0.0.1:{port}")
        # no kubelet yet: alive, not ready
        assert await http_get(port, "/healthz") == (200, "ok\n")
        status, body = await http_get(port, "/readyz")
        assert status == 503, body
        assert "starting" in body or f"{SIM}: not ready: not registered" in body

        await kubelet.start()
        await kubelet.wait_registered(SIM, timeout=10)
        await kubelet.wait_devices(SIM, lambda d: len(d) == 2)
        status, body = await get_until(port, "/readyz", lambda s, _b: s == 200)
        assert body == f"{SIM}: ready (2 devices)\n"

        status, text = await http_get(port, "/metrics")
        assert status == 200
        m = samples(text)
        res = (("resource", SIM),)
        assert m[("hetero_dp_devices", res)] == 2
        assert m[("hetero_dp_devices_healthy", res)] == 2
        assert m[("hetero_dp_resource_ready", res)] == 1
        assert m[("hetero_dp_list_and_watch_streams", res)] == 1
        # at least once: the daemon may register both on its retry and on seeing kubelet.sock
        assert m[("hetero_dp_registrations_total", (("mode", "classic"), *res))] >= 1
        restarts = m[("hetero_dp_kubelet_restarts_total", ())]

        labels = parse(await wait_file(label_dir / LABEL_FILE))
        assert labels[f"{SIM}.count"] == "2"

        # a kubelet restart: the daemon re-registers on the new kubelet.sock and is ready again
        await kubelet.restart()
        await kubelet.wait_registered(SIM, after=1, timeout=10)
        await kubelet.wait_devices(SIM, lambda d: len(d) == 2)
        await get_until(port, "/readyz", lambda s, _b: s == 200)
        _, text = await http_get(port, "/metrics")
        assert samples(text)[("hetero_dp_kubelet_restarts_total", ())] == restarts + 1

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        assert not (label_dir / LABEL_FILE).exists()  # a stopped plugin advertises nothing
    except AssertionError as e:
        raise AssertionError(f"{e}\ndaemon log:\n" + "\n".join(logs.lines)) from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await logs.close()
