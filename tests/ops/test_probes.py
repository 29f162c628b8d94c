"""/healthz and /readyz over real HTTP; /readyz follows registration and streams."""

from __future__ import annotations

import asyncio

import pytest

from hetero_dp.model.errors import ConfigError
from hetero_dp.ops import operations
from hetero_dp.ops.probes import parse_address
from tests.core.scripted import Scripted, make_devices

from .helpers import expect_event, http_get, port_of, wait_ready, wait_until

A = "example.com/a"
B = "example.com/b"


async def test_readyz_flips_when_a_stream_is_lost_and_back(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(A, 2) + make_devices(B, 2, prefix="b"))
    # a short stream timeout: the plugin re-registers soon after losing its stream
    config = {"metrics": {"address": "127.0.0.1:0"}, "streamTimeout": 2.0}
    daemon = await plugin_runner.start(backend, config=config)
    port = port_of(daemon)
    await fake_kubelet.wait_registered(A)
    await fake_kubelet.wait_registered(B)
    await wait_ready(daemon)
    status, body = await http_get(port, "/readyz")
    assert status == 200, body
    assert f"{A}: ready (2 devices)" in body and f"{B}: ready (2 devices)" in body

    closed = expect_event("stream_closed", lambda f: f["resource"] == A)
    await fake_kubelet.drop_stream(A)
    await asyncio.wait_for(closed, 10)
    status, body = await http_get(port, "/readyz")
    assert status == 503
    assert f"{A}: not ready: no ListAndWatch stream" in body
    assert f"{B}: ready" in body
    assert (await http_get(port, "/healthz"))[0] == 200  # alive all along

    await fake_kubelet.wait_registered(A, after=1, timeout=15)  # the plugin re-registers
    await wait_ready(daemon)
    status, body = await http_get(port, "/readyz")
    assert status == 200, body
    assert fake_kubelet.registration_count(B) == 1  # B was left alone


async def test_readyz_while_not_registered(fake_kubelet, plugin_runner):
    await fake_kubelet.stop()  # no kubelet: registration keeps retrying
    daemon = await plugin_runner.start(
        Scripted(make_devices(A, 1)), config={"metrics": {"address": "127.0.0.1:0"}}
    )
    status, body = await http_get(port_of(daemon), "/readyz")
    assert status == 503
    assert f"{A}: not ready: not registered with the kubelet" in body


async def test_healthz_routes_and_methods(fake_kubelet, plugin_runner):
    daemon = await plugin_runner.start(
        Scripted(make_devices(A, 1)), config={"metrics": {"address": "127.0.0.1:0"}}
    )
    port = port_of(daemon)
    assert await http_get(port, "/healthz") == (200, "ok\n")
    assert (await http_get(port, "/healthz", method="HEAD"))[0] == 200
    status, body = await http_get(port, "/nope")
    assert status == 404 and "/metrics" in body
    assert (await http_get(port, "/healthz", method="POST"))[0] == 405


async def test_probe_server_stops_with_the_daemon(fake_kubelet, plugin_runner):
    daemon = await plugin_runner.start(
        Scripted(make_devices(A, 1)), config={"metrics": {"address": "127.0.0.1:0"}}
    )
    port = port_of(daemon)
    await wait_ready(daemon)
    await plugin_runner.stop(daemon)
    with pytest.raises(OSError):
        await http_get(port, "/healthz")


async def test_busy_port_is_a_config_error(fake_kubelet, plugin_runner):
    first = await plugin_runner.start(
        Scripted(make_devices(A, 1)), config={"metrics": {"address": "127.0.0.1:0"}}
    )
    with pytest.raises(ConfigError, match=r"metrics.address.*cannot listen on 127.0.0.1:\d+"):
        await plugin_runner.start(
            Scripted(make_devices(B, 1)),
            config={"metrics": {"address": f"127.0.0.1:{port_of(first)}"}},
        )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":9435", (None, 9435)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        ("[::1]:9435", ("::1", 9435)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_parse_address(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["9435", "host:", "host:http", ":70000"])
def test_parse_address_rejects(text):
    with pytest.raises(ConfigError, match=r"metrics\.address"):
        parse_address(text)


async def test_malformed_and_silent_clients_do_not_hurt_the_server(fake_kubelet, plugin_runner):
    daemon = await plugin_runner.start(
        Scripted(make_devices(A, 1)), config={"metrics": {"address": "127.0.0.1:0"}}
    )
    port = port_of(daemon)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"garbage\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    writer.close()
    _, silent = await asyncio.open_connection("127.0.0.1", port)
    silent.close()  # connects and goes away without a request
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"a" * 100_000 + b"\r\n\r\n"
    )
    await reader.read()  # an over-long header line: dropped, whatever it answers
    writer.close()
    assert await http_get(port, "/healthz") == (200, "ok\n")


async def test_with_wait_for_port_a_taken_port_is_served_once_free(
    fake_kubelet, plugin_runner, caplog
):
    """The new pod of a surge rollout in the host network: the old pod holds the port."""
    import logging
    import socket

    caplog.set_level(logging.INFO, logger="hetero_dp.ops.probes")

    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        # before: exit 2, 'cannot listen on', so a surge pod in the host network crash-looped
        daemon = await plugin_runner.start(
            Scripted(make_devices(A, 1)),
            config={"metrics": {"address": f"127.0.0.1:{port}", "waitForPort": True}},
        )
        server = operations.of(daemon).server
        assert server is not None and not server.serving
        await fake_kubelet.wait_registered(A)  # the device plugin serves meanwhile
        # Expected in every surge roll, so said as expected: INFO, naming the rolling
        # update and what it waits for (before: a WARNING "... is taken", read as a fault).
        said = [r for r in caplog.records if r.name == "hetero_dp.ops.probes"]
        held = [r for r in said if f"127.0.0.1:{port} is held" in r.getMessage()]
        assert [r.levelno for r in held] == [logging.INFO], [r.getMessage() for r in said]
        assert "expected during a rolling update" in held[0].getMessage()
        assert "once the old pod releases the port" in held[0].getMessage()
        assert not [r for r in said if r.levelno >= logging.WARNING]
    finally:
        holder.close()  # the old pod exits
    await wait_until(daemon, lambda: server.serving, timeout=10)
    assert await http_get(port, "/healthz") == (200, "ok\n")
    await plugin_runner.stop(daemon)
    assert not server.serving


async def test_the_ready_file_follows_readyz(fake_kubelet, plugin_runner, tmp_path):
    ready_file = tmp_path / "run" / "ready"
    ready_file.parent.mkdir()
    ready_file.write_text("left by an earlier run\n")
    await fake_kubelet.stop()  # no kubelet yet: not registered, not ready
    daemon = await plugin_runner.start(
        Scripted(make_devices(A, 2)),
        config={"metrics": {"readyFile": str(ready_file)}, "streamTimeout": 2.0},
    )
    assert not ready_file.exists()  # an earlier run's file is not this instance's readiness
    await fake_kubelet.start()
    await wait_until(daemon, ready_file.exists)
    assert daemon.readiness()[0]
    assert f"{A}: ready (2 devices)" in ready_file.read_text()

    await fake_kubelet.drop_stream(A)  # not advertising: not ready
    await wait_until(daemon, lambda: not ready_file.exists())
    await fake_kubelet.wait_registered(A, after=1, timeout=15)
    await wait_until(daemon, ready_file.exists)

    await plugin_runner.stop(daemon)
    assert not ready_file.exists()


async def test_a_crowd_of_idle_and_slow_clients_is_capped_and_probes_get_through(
    fake_kubelet, plugin_runner, monkeypatch, caplog
):
    """More idle connections than the cap: the daemon holds at most the cap, closes
    the oldest idle ones to make room, logs one line for it, and /healthz answers."""
    from hetero_dp.ops import probes

    monkeypatch.setattr(probes, "IDLE_GRACE", 0.05)
    daemon = await plugin_runner.start(
        Scripted(make_devices(A, 1)), config={"metrics": {"address": "127.0.0.1:0"}}
    )
    port = port_of(daemon)
    crowd = []
    for _ in range(3 * probes.MAX_CONNECTIONS):  # connected, never a byte sent
        crowd.append(await asyncio.open_connection("127.0.0.1", port))
    try:
        server = operations.of(daemon).server
        await asyncio.sleep(0.1)  # the idle grace passes (a quiet spell, not a sync)
        status, _ = await http_get(port, "/healthz")
        assert status == 200
        assert server.open_connections <= probes.MAX_CONNECTIONS
        assert server.evicted > 0  # the oldest idle ones made room
    finally:
        for _, writer in crowd:
            writer.close()
    full = [r for r in caplog.records if "connections at once" in r.getMessage()]
    assert len(full) == 1
