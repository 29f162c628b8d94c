"""A backend that raises or hangs harms only its own devices; the daemon keeps serving."""

from __future__ import annotations

import grpc
import pytest

from hetero_dp import Device, hookimpl
from hetero_dp.model.errors import ConfigError

from .scripted import Scripted, make_devices

A, B = "example.com/a", "example.com/b"


async def test_discover_raising_marks_devices_unhealthy_then_recovers(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(A, 2))
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(A)
    backend.discover_error = RuntimeError("driver went away")
    await daemon.rediscover()
    devices = await fake_kubelet.wait_devices(A, lambda d: not any(x.healthy for x in d.values()))
    assert len(devices) == 2  # last known devices stay, unhealthy
    reason = daemon.resources[A].state.get("dev0").reason
    assert "discovery failed" in reason and "driver went away" in reason
    backend.discover_error = None
    await daemon.rediscover()
    await fake_kubelet.wait_devices(A, lambda d: all(x.healthy for x in d.values()))


async def test_check_health_raising_is_contained_per_device(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(A, 2))
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(A)
    backend.health_error["dev1"] = OSError("sysfs read failed")
    await daemon.poll_health()
    devices = await fake_kubelet.wait_devices(A, lambda d: not d["dev1"].healthy)
    assert devices["dev0"].healthy
    assert "sysfs read failed" in daemon.resources[A].state.get("dev1").reason


async def test_check_health_hanging_times_out(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(A, 1))
    daemon = await plugin_runner.start(backend, config={"hookTimeout": 0.2})
    await fake_kubelet.wait_registered(A)
    backend.health_hang.set()
    try:
        await daemon.poll_health()
        await fake_kubelet.wait_devices(A, lambda d: not d["dev0"].healthy)
        assert "timed out" in daemon.resources[A].state.get("dev0").reason
    finally:
        backend.release.set()


class Garbage:
    hetero_dp_name = "garbage"

    def __init__(self) -> None:
        self.mode = "ok"

    @hookimpl
    def discover(self):
        if self.mode == "garbage":
            return ["not a device", 42]
        return [Device(id="g0", resource=B)]


async def test_garbage_from_one_backend_leaves_another_serving(fake_kubelet, plugin_runner):
    good = Scripted(make_devices(A, 2))
    bad = Garbage()
    daemon = await plugin_runner.start(good, bad)
    await fake_kubelet.wait_registered(A)
    await fake_kubelet.wait_registered(B)
    bad.mode = "garbage"
    await daemon.rediscover()
    await fake_kubelet.wait_devices(B, lambda d: not d["g0"].healthy)
    assert "not Device" in daemon.resources[B].state.get("g0").reason
    resp = await fake_kubelet.allocate(A, ["dev0"])  # the other backend is untouched
    assert resp.envs["VISIBLE"] == "0"


class CrashingWatch(Scripted):
    hetero_dp_name = "crashing"

    @hookimpl
    def watch(self, events):
        self.watch_started.set()
        raise RuntimeError("event loop of the vendor library died")


async def test_watch_hook_raising_marks_devices_unhealthy(fake_kubelet, plugin_runner):
    backend = CrashingWatch(make_devices(A, 2))
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 2 and not d["dev0"].healthy)
    assert "health watcher failed" in daemon.resources[A].state.get("dev0").reason


class AllocRaises(Scripted):
    @hookimpl
    def allocate(self, devices, response):
        raise KeyError("vendor table")


async def test_allocate_hook_raising_is_a_clean_grpc_error(fake_kubelet, plugin_runner):
    await plugin_runner.start(AllocRaises(make_devices(A, 1)))
    await fake_kubelet.wait_registered(A)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(A, ["dev0"])
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "dev0" in err.value.details() and "vendor table" in err.value.details()


async def test_invalid_resource_name_from_backend_stops_startup(fake_kubelet, plugin_runner):
    backend = Scripted([Device(id="x", resource="no-slash")])
    with pytest.raises(ConfigError) as err:
        await plugin_runner.start(backend)
    assert "no vendor prefix" in str(err.value) and "backend scripted" in str(err.value)
    assert [p.name for p in fake_kubelet.plugin_dir.iterdir()] == ["kubelet.sock"]


async def test_two_backends_claiming_one_resource_is_a_config_error(plugin_runner):
    with pytest.raises(ConfigError) as err:
        await plugin_runner.start(Scripted(make_devices(A, 1)), OtherA())
    assert "served by backend 'scripted' already" in str(err.value)


class OtherA:
    hetero_dp_name = "other"

    @hookimpl
    def discover(self):
        return [Device(id="z", resource=A)]


async def test_duplicate_ids_from_discover_are_refused_by_name(fake_kubelet, plugin_runner):
    devices = make_devices(A, 3)
    backend = Scripted(devices)
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(A)
    backend.devices = [*devices, devices[2], devices[0], devices[2]]
    await daemon.rediscover()
    await fake_kubelet.wait_devices(A, lambda d: not any(x.healthy for x in d.values()))
    reason = daemon.resources[A].state.get("dev1").reason
    assert "duplicate IDs: ['dev0', 'dev2']" in reason


LONG = "a" * 60 + ".example.com/accel"  # a valid name, but its socket path is too long


async def test_resource_whose_socket_path_is_too_long_stops_startup(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(A, 1) + make_devices(LONG, 1, prefix="long"))
    with pytest.raises(ConfigError) as err:
        await plugin_runner.start(backend)
    assert "unix sockets allow 105" in str(err.value) and "backend scripted" in str(err.value)


async def test_resource_whose_socket_path_is_too_long_later_is_skipped(fake_kubelet, plugin_runner):
    devices = make_devices(A, 2)
    backend = Scripted(devices)
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 2)
    backend.devices = devices[:1] + make_devices(LONG, 1, prefix="long")
    await daemon.rediscover()  # refused with an error in the log; the rest is published
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 1)
    assert LONG not in daemon.resources
    assert backend.watch_started.wait(5)
    backend.devices = devices  # and rediscovery goes on
    backend.sinks[0].rediscover()
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 2)


async def test_hung_health_checks_do_not_starve_allocate(fake_kubelet, plugin_runner):
    """Health checks hanging on every device fill the backend's worker threads; the
    Allocate hook runs in threads of its own and still answers."""
    import asyncio

    backend = Scripted(make_devices(A, 6))
    daemon = await plugin_runner.start(backend, config={"hookTimeout": 5})
    await fake_kubelet.wait_registered(A)
    backend.health_hang.set()
    poll = asyncio.create_task(daemon.poll_health())
    try:
        # the allocate hook must not wait for a worker held by a hung check
        resp = await fake_kubelet.allocate(A, ["dev0"])
        assert resp.envs["SCRIPTED_COUNT"] == "1"
        assert backend.allocated == [["dev0"]]
        assert not poll.done()  # the checks really were still hanging
    finally:
        backend.release.set()
        await poll


class WrongTypes:
    """A record made with the wrong element types (a str where a DeviceNode belongs,
    and the like): refused where it is made, so only this backend's devices suffer."""

    hetero_dp_name = "wrongtypes"

    def __init__(self, mistake: dict) -> None:
        self.mistake = mistake
        self.broken = False

    @hookimpl
    def discover(self):
        if self.broken:
            return [Device(id="w0", resource=B, **self.mistake)]
        return [Device(id="w0", resource=B)]


@pytest.mark.parametrize(
    ("mistake", "message"),
    [
        ({"nodes": ["/dev/null"]}, "nodes[0] must be a DeviceNode, got str '/dev/null'"),
        ({"nodes": "/dev/null"}, "nodes must be a list of DeviceNode, got str '/dev/null'"),
        ({"mounts": [("/a", "/b")]}, "mounts[0] must be a Mount, got tuple"),
        ({"env": {"X": None}}, "env[X] must be a str, got NoneType None"),
        ({"env": ["X=1"]}, "env must be a mapping of str to str"),
        ({"annotations": {"a": 1}}, "annotations[a] must be a str, got int 1"),
        ({"index": "0"}, "index must be an int or None, got str '0'"),
    ],
)
async def test_a_record_of_wrong_types_harms_only_its_backend(
    fake_kubelet, plugin_runner, caplog, mistake, message
):
    good = Scripted(make_devices(A, 2))
    bad = WrongTypes(mistake)
    daemon = await plugin_runner.start(good, bad)
    await fake_kubelet.wait_registered(B)
    bad.broken = True
    await daemon.rediscover()
    await fake_kubelet.wait_devices(B, lambda d: not d["w0"].healthy)
    reason = daemon.resources[B].state.get("w0").reason
    assert message in reason, reason
    # the log names the author's line that made the record
    made_at = f"at {__file__}:{WrongTypes.discover.__code__.co_firstlineno + 3}"
    assert any(message in r.message and made_at in r.message for r in caplog.records), [
        r.message for r in caplog.records
    ]
    resp = await fake_kubelet.allocate(A, ["dev0"])  # the other backend is untouched
    assert resp.envs["VISIBLE"] == "0"


def test_a_device_node_or_mount_of_wrong_types_is_refused_where_it_is_made():
    from hetero_dp import DeviceNode, Mount

    with pytest.raises(TypeError, match=r"host_path must be a str, got PosixPath"):
        from pathlib import Path

        DeviceNode(Path("/dev/null"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"read_only must be a bool, got str 'yes'"):
        Mount("/a", "/b", read_only="yes")  # type: ignore[arg-type]
