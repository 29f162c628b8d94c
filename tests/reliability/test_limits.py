"""Low process limits and a crowd on the probe port (issue #36 point 4).

Start-up checks the descriptor and address-space limits it needs and stops with
exit 2 naming the limit and the value (before: half-registered, a traceback, or
an abort on SIGTERM); a crowd of idle clients on the probe port leaves /healthz
answering, a kubelet restart's re-registration fast and the log short."""

from __future__ import annotations

import asyncio
import errno
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from hetero_dp.testing import short_tempdir

from .conftest import SIM


@pytest.fixture
def short_dir():
    """A kubelet dir short enough for the sockets' paths (unix sockets allow 105 bytes)."""
    path = short_tempdir("hlim-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_limited(env, args: list[str], limits: dict[int, int], timeout: float = 20):
    """``hetero-dp ARGS`` with soft and hard ``limits`` set in the child."""

    def preexec() -> None:
        for which, value in limits.items():
            resource.setrlimit(which, (value, value))

    return subprocess.run(
        [sys.executable, "-m", "hetero_dp", *args],
        env=env,
        preexec_fn=preexec,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_too_few_descriptors_stop_start_up_naming_the_limit(daemon_env, short_dir):
    done = run_limited(
        daemon_env,
        ["run", "simulated", "--kubelet-dir", str(short_dir)],
        {resource.RLIMIT_NOFILE: 30},
    )
    assert done.returncode == 2, done.stderr
    assert "RLIMIT_NOFILE" in done.stderr and "ulimit -n 128" in done.stderr
    assert "Traceback" not in done.stderr and "\0" not in done.stderr


def test_too_little_address_space_stops_start_up_naming_the_limit(daemon_env, short_dir):
    done = run_limited(
        daemon_env,
        ["run", "simulated", "--kubelet-dir", str(short_dir)],
        {resource.RLIMIT_AS: 100_000 * 1024},  # ulimit -v 100000
    )
    assert done.returncode == 2, done.stderr  # gRPC's threads failed, then SIGABRT (134)
    assert "RLIMIT_AS" in done.stderr and "ulimit -v" in done.stderr
    assert "pthread_create failed" not in done.stderr


async def test_descriptors_for_every_resource_or_none_registers(fake_kubelet, daemon_env, tmp_path):
    """Enough descriptors to start, not for ten resources: none registers, and the
    message names the need for them (before: six of ten never registered)."""
    names = ",".join(f"example.com/r{i}" for i in range(10))
    args = ["run", "simulated", "--kubelet-dir", str(fake_kubelet.plugin_dir)]
    args += ["-o", f"simulated.resources={names}", "-o", "simulated.count=2"]
    done = await asyncio.to_thread(run_limited, daemon_env, args, {resource.RLIMIT_NOFILE: 140})
    assert done.returncode == 2, done.stderr
    assert "for 10 resources with 20 devices" in done.stderr
    assert fake_kubelet.resources == {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str, timeout: float) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def _healthz(port: int, within: float, each: float = 2.0) -> bytes:
    """/healthz's answer, asked until one comes within ``within`` seconds (a try
    refused or closed unanswered is tried again)."""
    deadline = time.monotonic() + within
    while True:
        try:
            answer = await asyncio.to_thread(_get, port, "/healthz", each)
            if answer:
                return answer
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"/healthz did not answer within {within}s")
        await asyncio.sleep(0.1)  # polling a port for an answer


IDLE_CLIENTS = 600  # over the child's 256 descriptors, as 1,500 were over 1,024


async def test_a_crowd_of_idle_clients_on_the_probe_port(fake_kubelet, daemon_env, tmp_path):
    port = _free_port()
    log = tmp_path / "daemon.log"
    args = ["-m", "hetero_dp", "run", "simulated", "--kubelet-dir", str(fake_kubelet.plugin_dir)]
    args += ["-o", "simulated.count=3", "--metrics-address", f"127.0.0.1:{port}"]

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    with open(log, "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            env=daemon_env,
            stdin=asyncio.subprocess.DEVNULL,
            stderr=err,
            preexec_fn=preexec,
        )
    crowd: list[socket.socket] = []
    try:
        await fake_kubelet.wait_registered(SIM, timeout=30)
        assert b" 200 " in await _healthz(port, 20)
        lines_before = len(log.read_bytes().splitlines())
        for _ in range(IDLE_CLIENTS):  # connect, send nothing, keep the socket open
            s = socket.socket()
            s.setblocking(False)
            assert s.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS)
            crowd.append(s)
        # a probe's try gets 1 s (the kubelet's default timeoutSeconds); a try in the
        # crowd's first half second may be refused (the kubelet fails a pod only after
        # failureThreshold, 3, failed tries); one of the first tries is answered
        answer = await _healthz(port, 3.0, each=1.0)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        before = fake_kubelet.registration_count(SIM)
        await fake_kubelet.restart()
        restarted = time.monotonic()
        await fake_kubelet.wait_registered(SIM, after=before, timeout=15)
        took = time.monotonic() - restarted
        assert took < 1.5, f"re-registration took {took:.2f}s with the crowd at the door"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        for s in crowd:
            s.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = log.read_bytes().splitlines()[lines_before:]
    assert len(lines) < 100, b"\n".join(lines[:40]).decode(errors="replace")
    assert not any(b"Traceback" in line for line in lines)
