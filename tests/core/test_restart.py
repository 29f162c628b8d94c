"""Kubelet restarts, by both signals, re-register; other resources stay undisturbed."""

from __future__ import annotations

import asyncio
import contextlib

from .scripted import Scripted, make_devices

A, B = "example.com/a", "example.com/b"


def two_resources() -> Scripted:
    return Scripted(make_devices(A, 2, prefix="a") + make_devices(B, 2, prefix="b"))


async def test_full_kubelet_restart_re_registers_every_resource(fake_kubelet, plugin_runner):
    await plugin_runner.start(two_resources(), config={"streamTimeout": 60})
    await fake_kubelet.wait_registered(A)
    await fake_kubelet.wait_registered(B)
    await fake_kubelet.restart()
    for name in (A, B):
        res = await fake_kubelet.wait_registered(name, after=1)
        await fake_kubelet.wait_devices(name, lambda d: len(d) == 2)
        assert res.allocatable == 2
    assert fake_kubelet.registration_count(A) == 2
    assert fake_kubelet.registration_count(B) == 2


async def test_kubelet_sock_creation_alone_triggers_re_registration(fake_kubelet, plugin_runner):
    # the stream watchdog is far away: only the inotify signal can explain a quick re-registration
    await plugin_runner.start(two_resources(), config={"streamTimeout": 600})
    await fake_kubelet.wait_registered(A)
    await fake_kubelet.wait_registered(B)
    await fake_kubelet.stop()  # plugin sockets stay; kubelet.sock goes
    await fake_kubelet.start()  # kubelet.sock is created again
    await fake_kubelet.wait_registered(A, after=1, timeout=10)
    await fake_kubelet.wait_registered(B, after=1, timeout=10)


async def test_own_socket_deletion_restarts_only_that_resource(fake_kubelet, plugin_runner):
    daemon = await plugin_runner.start(two_resources(), config={"streamTimeout": 600})
    res_a = await fake_kubelet.wait_registered(A)
    res_b = await fake_kubelet.wait_registered(B)
    updates_b = res_b.updates
    daemon.front_end.endpoints[A].socket_path.unlink()
    await fake_kubelet.wait_registered(A, after=1)
    assert daemon.front_end.endpoints[A].socket_path.exists()
    assert daemon.front_end.endpoints[A].restarts == 1
    # B: same registration, same stream, still open
    assert fake_kubelet.registration_count(B) == 1
    assert daemon.front_end.endpoints[B].restarts == 0
    assert res_b.stream_open and not res_b.stream_ended and res_b.updates == updates_b
    assert res_a is not fake_kubelet.resources[A]


async def test_registration_retries_until_kubelet_appears(fake_kubelet, plugin_runner):
    await fake_kubelet.stop()
    starting = asyncio.create_task(plugin_runner.start(two_resources()))
    daemon = await asyncio.wait_for(starting, 10)
    assert not daemon.front_end.session(A).registered
    await fake_kubelet.start()
    await fake_kubelet.wait_registered(A)
    await fake_kubelet.wait_registered(B)
    # the new kubelet.sock woke the pending Register; no restart sent a second one
    endpoints = daemon.front_end.endpoints
    assert endpoints[A].restarts == 0 and endpoints[B].restarts == 0
    assert fake_kubelet.registration_count(A) == 1


async def test_lost_stream_leads_to_re_registration(fake_kubelet, plugin_runner):
    await plugin_runner.start(two_resources(), config={"streamTimeout": 0.3})
    await fake_kubelet.wait_registered(A)
    await fake_kubelet.drop_stream(A)
    await fake_kubelet.wait_registered(A, after=1)
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 2)


async def test_watcher_mode_registers_and_survives_restart(fake_kubelet, plugin_runner):
    daemon = await plugin_runner.start(
        two_resources(), config={"registration": "watcher", "streamTimeout": 60}
    )
    res = await fake_kubelet.wait_registered(A)
    await fake_kubelet.wait_registered(B)
    assert ("example.com/a", "watcher") in fake_kubelet.registrations
    assert daemon.front_end.session(A).registered  # NotifyRegistrationStatus reached the plugin
    assert res.allocatable == 2
    await fake_kubelet.restart()
    await fake_kubelet.wait_registered(A, after=1)
    await fake_kubelet.wait_registered(B, after=1)
    # deleting the registration socket deregisters; the plugin puts it back
    ep = daemon.front_end.endpoints[A]
    await fake_kubelet.wait_for(lambda: ep.registry_socket.exists() and A in fake_kubelet.resources)
    restarts, count = ep.restarts, fake_kubelet.registration_count(A)
    with contextlib.suppress(FileNotFoundError):
        ep.registry_socket.unlink()
    await fake_kubelet.wait_for(
        lambda: (
            ep.restarts > restarts
            and fake_kubelet.registration_count(A) > count
            and A in fake_kubelet.resources
        )
    )


async def test_watcher_mode_kubelet_restart_registers_once_without_plugin_restart(
    fake_kubelet, plugin_runner
):
    """In watcher mode the kubelet's walk of plugins_registry re-registers the plugin;
    the new kubelet.sock must not also restart it (that would register it twice)."""
    daemon = await plugin_runner.start(
        two_resources(), config={"registration": "watcher", "streamTimeout": 60}
    )
    await fake_kubelet.wait_registered(A)
    # both first: a stop during B's first GetInfo would leave B registered once in all
    await fake_kubelet.wait_registered(B)
    await fake_kubelet.stop()  # plugin sockets stay, as after a kubelet crash
    await fake_kubelet.start()  # new kubelet.sock; the registry walk finds our sockets
    await fake_kubelet.wait_registered(A, after=1)
    await fake_kubelet.wait_registered(B, after=1)
    assert fake_kubelet.registration_count(A) == 2
    assert fake_kubelet.registration_count(B) == 2
    endpoints = daemon.front_end.endpoints
    assert endpoints[A].restarts == 0 and endpoints[B].restarts == 0


def _listening(path) -> bool:
    """Whether a unix socket still listens on ``path`` (even once its file is gone).
    The kernel names a socket by the path it was bound to: the endpoint binds a
    hidden ``.<name>.<random>`` beside ``path`` and renames it (see bind_unix)."""
    import os

    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    bound = [os.path.normpath(r[7]) for r in rows if len(r) == 8]
    hidden = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.")
    return any(b == str(path) or b.startswith(hidden) for b in bound)


async def test_stop_during_a_restart_leaves_no_server_behind(fake_kubelet, plugin_runner):
    daemon = await plugin_runner.start(Scripted(make_devices(A, 1, prefix="a")))
    await fake_kubelet.wait_registered(A)
    ep = daemon.front_end.endpoints[A]
    assert _listening(ep.socket_path)
    ep.request_restart("test")
    for _ in range(10_000):  # step the loop until the new server is starting
        if ep.restarts and ep.changing and not ep.server.serving:
            break
        await asyncio.sleep(0)
    else:
        raise AssertionError("the restart never reached its start")
    await ep.stop()
    assert not _listening(ep.socket_path)
