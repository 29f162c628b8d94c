"""DRA mode against a slow, hostile or careless API server (issue #36 points 3 and 7).

A server that trickles its answers gets a logged timeout at the call's deadline, a
huge answer is refused at the cap with bounded memory, SIGTERM ends a driver whose
start-up the server holds; a TLS server that drops idle connections without a
``close_notify`` (kube-apiserver after its 90 s ``IdleTimeout``) costs a health
change no time."""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hetero_dp.dra import device_name
from hetero_dp.dra.client import MAX_RESPONSE_BYTES, APIError, ClusterConfig, KubeClient
from hetero_dp.testing import short_tempdir
from hetero_dp.testing.dra import DRARunner, FakeAPIServer

from .backend import DRIVER, RES, Npus
from .test_cli import spawn, wait_exit


def call_in_thread(fn, limit: float) -> dict:
    """Run ``fn`` in a daemon thread, waiting at most ``limit`` s; what it returned or
    raised, how long it took, and whether it was still running."""
    out: dict = {}

    def run() -> None:
        started = time.monotonic()
        try:
            out["value"] = fn()
        except Exception as e:
            out["error"] = e
        out["took"] = time.monotonic() - started

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    out["alive"] = t.is_alive()
    return out


def test_a_trickled_answer_fails_at_its_deadline_with_a_logged_timeout(caplog):
    with FakeAPIServer() as server:
        server.misbehaviour.trickle = 0.05  # each read gets a byte well within any timeout
        client = KubeClient(ClusterConfig(server=server.url), timeout=1.0)
        with caplog.at_level(logging.WARNING, logger="hetero_dp.dra"):
            out = call_in_thread(lambda: client.request("GET", "/apis/resource.k8s.io"), 10)
        assert not out["alive"], "a trickling server held the call past its deadline"
        assert isinstance(out["error"], APIError) and out["error"].reason == "Timeout"
        assert out["error"].retriable
        assert 0.9 <= out["took"] < 3.0
        assert "no whole answer within 1s" in caplog.text
        assert server.misbehaviour.sent > 5  # it did trickle, and the client read it


def test_a_trickled_watch_is_cut_when_no_event_comes_in_time():
    with FakeAPIServer() as server:
        server.misbehaviour.trickle = 0.05
        client = server.client()
        stream = client.stream("/apis/resource.k8s.io/v1/resourceslices", timeout=1.0)

        def read() -> list[bytes]:
            return list(stream.lines())

        out = call_in_thread(read, 10)
        stream.close()
    assert not out["alive"], "a watch that never completes an event was held open"
    assert isinstance(out["error"], APIError) and out["error"].reason == "Timeout"
    assert out["took"] < 3.0


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_huge_answer_is_refused_at_the_cap(chunked):
    with FakeAPIServer() as server:
        server.misbehaviour.body_bytes = 800 << 20
        server.misbehaviour.chunked = chunked
        client = server.client()
        with pytest.raises(APIError) as e:
            client.request("GET", "/apis/resource.k8s.io/v1/resourceslices")
        assert e.value.reason == "TooLarge"
        # what the server got out is the cap and the sockets' buffers, not the answer
        assert server.misbehaviour.sent < MAX_RESPONSE_BYTES + (16 << 20)


def test_a_huge_answer_leaves_memory_bounded():
    """In a process of its own, so its peak RSS is the client's alone."""
    script = (
        "import resource, sys\n"
        "from hetero_dp.dra.client import APIError, ClusterConfig, KubeClient\n"
        "c = KubeClient(ClusterConfig(server=sys.argv[1]))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n"
        "try:\n"
        "    c.request('GET', '/apis/resource.k8s.io/v1/resourceslices')\n"
        "except APIError as e:\n"
        "    print(e.reason)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n"
    )
    with FakeAPIServer() as server:
        server.misbehaviour.body_bytes = 800 << 20
        server.misbehaviour.chunked = True
        done = subprocess.run(
            [sys.executable, "-c", script, server.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
    before, reason, after = done.stdout.split()
    assert reason == "TooLarge", done.stdout + done.stderr
    # MiB more than the process held before the call: the cap (16 MiB) read and joined;
    # reading the answer whole took 2.2 GB (issue #36)
    assert int(after) - int(before) < 64


async def test_sigterm_ends_a_driver_whose_start_the_server_holds(
    dra, api_server, hetero_dp_cmd, cli_env
):
    api_server.misbehaviour.trickle = 0.5  # every call held: the driver stays starting
    proc = spawn(dra, hetero_dp_cmd, cli_env)
    try:
        assert await asyncio.to_thread(api_server.misbehaviour.hit.wait, 30)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code, out = await wait_exit(proc, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - sent
    assert code == 0, out
    # the API server gets 10 s from SIGTERM (STOP_API_BUDGET), well in a pod's 30 s grace
    assert took < 20.0, out
    assert "got no whole answer within 10s" in out or "did not answer the stop's calls" in out


async def test_the_stop_cuts_what_the_server_holds_after_its_budget(
    dra, api_server, monkeypatch, caplog
):
    monkeypatch.setattr("hetero_dp.dra.stopping.STOP_API_BUDGET", 0.5)
    await dra.start(Npus(2))
    api_server.misbehaviour.trickle = 0.05  # from now on, every call is held
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hetero_dp.dra"):
        await dra.stop_all()
    # the watch's join waits up to 5 s; the calls themselves end at the budget
    assert time.monotonic() - started < 8.0
    assert "did not answer the stop's calls" in caplog.text


# --- TLS, and connections the server drops while idle ---------------------------


def self_signed(tmp: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, made here (openssl's command line)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command (make system-deps installs it)")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def test_a_kept_alive_tls_connection_dropped_while_idle_is_replaced_at_once(tmp_path):
    idle = 0.3
    with FakeAPIServer(tls=self_signed(tmp_path), idle_timeout=idle) as server:
        server.add_node("n")
        client = server.client()
        assert client.request("GET", "/api/v1/nodes/n")["metadata"]["name"] == "n"
        # the server drops the idle connection, no close_notify
        assert server.transport.wait_until(lambda: server.transport.idle_drops >= 1, 10)
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}
        for method, path, payload in [
            ("GET", "/api/v1/nodes/n", None),
            ("POST", "/apis/resource.k8s.io/v1/resourceslices?dryRun=All", body),
        ]:
            drops = server.transport.idle_drops
            try:
                client.request(method, path, body=payload)
            except APIError as e:
                assert e.status != 0, f"{method} on a dropped connection failed: {e}"
            assert server.transport.wait_until(lambda d=drops: server.transport.idle_drops > d, 10)
        assert client.most_connects == 1  # one fresh connection per call, no more


async def test_a_health_change_after_a_quiet_spell_reaches_a_tls_server_at_once(tmp_path):
    """The server drops connections idle longer than 0.3 s (kube-apiserver: 90 s); a
    health change after a quiet spell longer than that is written within 2 s."""
    with FakeAPIServer(tls=self_signed(tmp_path), idle_timeout=0.3) as server:
        root = short_tempdir("hdra-")
        runner = DRARunner(root, server)
        try:
            daemon = await runner.start(Npus(2))
            assert len(server.devices_of(DRIVER)) == 2
            drops = server.transport.idle_drops
            # the quiet spell: every kept-alive connection sits idle and is dropped; the
            # watch's stays open
            assert await asyncio.to_thread(
                server.transport.wait_until,
                lambda: (
                    server.transport.idle_drops > drops
                    and server.transport.open_connections == server.watches
                ),
                10,
            )
            writes = len(server.writes())
            daemon.set_health("npus", "NPU-0000", False, "XID 79")  # as a watch hook would
            changed = time.monotonic()
            await server.wait_for(
                lambda: device_name("NPU-0000") not in server.devices_of(DRIVER), timeout=10
            )
            assert time.monotonic() - changed < 2.0
            assert len(server.writes()) > writes
            assert daemon.front_end.drivers[RES].settings.resync_interval == 0  # no check
        finally:
            await runner.stop_all()
            shutil.rmtree(root, ignore_errors=True)


async def test_a_failed_write_is_retried_with_the_back_off_not_left_to_the_check(dra, api_server):
    """The watch is live (the server answers it) while a write fails with no answer:
    the publisher retries after the back-off; no periodic check runs here."""
    daemon = await dra.start(Npus(2))
    driver = daemon.front_end.drivers[RES]
    assert driver.publisher.cache.live
    daemon.front_end.api_client.timeout = 0.5
    api_server.misbehaviour.methods = frozenset({"PUT", "POST", "DELETE"})
    api_server.misbehaviour.trickle = 0.05  # writes are held past their deadline
    daemon.set_health("npus", "NPU-0000", False, "XID 79")
    assert await asyncio.to_thread(api_server.misbehaviour.hit.wait, 10)
    api_server.misbehaviour.trickle = 0.0  # the server answers writes again
    api_server.misbehaviour.end()
    await api_server.wait_for(
        lambda: device_name("NPU-0000") not in api_server.devices_of(DRIVER), timeout=10
    )
    assert driver.settings.resync_interval == 0


def test_periodic_checks_of_drivers_started_together_are_spread():
    """30 s checks of drivers started in the same second do not stay in step: each
    wait is drawn from the last half of the interval."""
    from hetero_dp.dra.resync import SliceSync

    def sync() -> SliceSync:
        return SliceSync(
            "d",
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            api_versions=(),
            resync_interval=lambda: 30.0,
            watch_slices=False,
            devices=list,
            running=lambda: True,
        )

    waits = [sync()._next_check() for _ in range(40)]
    assert all(w is not None and 15.0 <= w <= 30.0 for w in waits)
    assert len({int(w) for w in waits if w is not None}) >= 6  # not the same second
