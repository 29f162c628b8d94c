"""Registration, ListAndWatch, Allocate, GetPreferredAllocation and PreStartContainer
over real unix sockets against the fake kubelet."""

from __future__ import annotations

import grpc
import pytest

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc

from .scripted import Scripted, WithPreStart, make_devices

RES = "example.com/accel"


async def test_registers_after_dial_back_with_agreeing_options(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 3))
    await plugin_runner.start(backend)
    res = await fake_kubelet.wait_registered(RES)
    # the fake kubelet only records a registration after dialing back and comparing options
    assert fake_kubelet.registrations == [(RES, "classic")]
    assert res.options.get_preferred_allocation_available is True
    assert res.options.pre_start_required is False
    assert res.endpoint.endswith(".sock")
    assert fake_kubelet.rejections == []


async def test_pre_start_hook_sets_option_and_is_called(fake_kubelet, plugin_runner):
    backend = WithPreStart(make_devices(RES, 2))
    await plugin_runner.start(backend)
    res = await fake_kubelet.wait_registered(RES)
    assert res.options.pre_start_required is True
    await fake_kubelet.pre_start(RES, ["dev1"])
    assert backend.pre_started == [["dev1"]]


async def test_list_and_watch_sends_full_set_with_topology(fake_kubelet, plugin_runner):
    await plugin_runner.start(Scripted(make_devices(RES, 4)))
    devices = await fake_kubelet.wait_devices(RES, lambda d: len(d) == 4)
    assert list(devices) == ["dev0", "dev1", "dev2", "dev3"]
    assert [d.numa_nodes for d in devices.values()] == [(0,), (1,), (0,), (1,)]
    assert all(d.healthy for d in devices.values())


async def test_health_flip_and_recovery_reach_the_kubelet(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 2))
    await plugin_runner.start(backend)
    res = await fake_kubelet.wait_registered(RES)
    assert backend.watch_started.wait(5)
    backend.sinks[0].set_health("dev1", False, "XID 79")
    await fake_kubelet.wait_devices(RES, lambda d: not d["dev1"].healthy)
    assert res.allocatable == 1 and res.capacity == 2
    backend.sinks[0].set_health("dev1", True, "recovered")
    await fake_kubelet.wait_devices(RES, lambda d: d["dev1"].healthy)
    assert res.allocatable == 2


async def test_polled_health_flip_and_recovery(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 2))
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(RES)
    backend.unhealthy["dev0"] = "temperature 105C"
    await daemon.poll_health()
    await fake_kubelet.wait_devices(RES, lambda d: not d["dev0"].healthy)
    assert daemon.resources[RES].state.get("dev0").reason == "temperature 105C"
    del backend.unhealthy["dev0"]
    await daemon.poll_health()
    await fake_kubelet.wait_devices(RES, lambda d: d["dev0"].healthy)


async def test_device_removal_and_addition_reach_the_kubelet(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 3))
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 3)
    backend.devices = backend.devices[:2]
    await daemon.rediscover()
    devices = await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    assert "dev2" not in devices
    backend.devices = make_devices(RES, 5)
    await daemon.rediscover()
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 5)


async def test_rediscover_event_from_watch_hook(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 1))
    await plugin_runner.start(backend)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 1)
    assert backend.watch_started.wait(5)
    backend.devices = make_devices(RES, 2)
    backend.sinks[0].rediscover()
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)


async def test_concurrent_streams_each_get_updates(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 2))
    daemon = await plugin_runner.start(backend)
    res = await fake_kubelet.wait_registered(RES)
    endpoint = daemon.front_end.endpoints[RES].socket_path
    async with grpc.aio.insecure_channel(f"unix://{endpoint}") as ch:
        stub = pb_grpc.DevicePluginStub(ch)
        streams = [stub.ListAndWatch(pb.Empty()) for _ in range(3)]
        first = [await s.read() for s in streams]
        assert all(len(m.devices) == 2 for m in first)
        backend.sinks[0].set_health("dev0", False, "fault")
        for s in streams:
            msg = await s.read()
            assert {d.ID: d.health for d in msg.devices} == {
                "dev0": "Unhealthy",
                "dev1": "Healthy",
            }
        for s in streams:
            s.cancel()
    await fake_kubelet.wait_devices(RES, lambda d: not d["dev0"].healthy)
    assert res.stream_open


async def test_allocate_builds_response_from_records(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 3))
    await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(RES)
    resp = await fake_kubelet.allocate(RES, ["dev2", "dev0"])
    assert dict(resp.envs) == {"VISIBLE": "2,0", "DRIVER": "v1", "SCRIPTED_COUNT": "2"}
    assert [(d.host_path, d.container_path, d.permissions) for d in resp.devices] == [
        ("/dev/dev2", "/dev/dev2", "rw"),
        ("/dev/ctl", "/dev/ctl", "rw"),
        ("/dev/dev0", "/dev/dev0", "rw"),
    ]
    assert dict(resp.annotations) == {"example.com/dev2": "yes", "example.com/dev0": "yes"}
    assert backend.allocated == [["dev2", "dev0"]]


@pytest.mark.parametrize(
    ("ids", "code", "named"),
    [
        ([], grpc.StatusCode.INVALID_ARGUMENT, "empty request"),
        (["dev0", "dev0"], grpc.StatusCode.INVALID_ARGUMENT, "'dev0'"),
        (["dev0", "nope", "gone"], grpc.StatusCode.INVALID_ARGUMENT, "'nope', 'gone'"),
        (["dev1"], grpc.StatusCode.FAILED_PRECONDITION, "'dev1': overheated"),
    ],
    ids=["empty", "duplicate", "unknown", "unhealthy"],
)
async def test_allocate_errors_name_the_ids(fake_kubelet, plugin_runner, ids, code, named):
    backend = Scripted(make_devices(RES, 2))
    await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(RES)
    backend.sinks[0].set_health("dev1", False, "overheated")
    await fake_kubelet.wait_devices(RES, lambda d: not d["dev1"].healthy)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(RES, ids)
    assert err.value.code() == code
    assert named in err.value.details()
    assert "Traceback" not in err.value.details()
    assert backend.allocated == []


async def test_allocate_without_container_requests_is_invalid(fake_kubelet, plugin_runner):
    daemon = await plugin_runner.start(Scripted(make_devices(RES, 1)))
    await fake_kubelet.wait_registered(RES)
    socket = daemon.front_end.endpoints[RES].socket_path
    async with grpc.aio.insecure_channel(f"unix://{socket}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.DevicePluginStub(ch).Allocate(pb.AllocateRequest())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_preferred_allocation_honours_must_include_and_numa(fake_kubelet, plugin_runner):
    await plugin_runner.start(Scripted(make_devices(RES, 6)))
    await fake_kubelet.wait_registered(RES)
    ids = [f"dev{i}" for i in range(6)]
    chosen = await fake_kubelet.preferred_allocation(RES, ids, ["dev1"], 3)
    assert len(chosen) == 3 and "dev1" in chosen
    # dev1 is on NUMA node 1: the rest come from node 1 too (dev3, dev5)
    assert set(chosen) == {"dev1", "dev3", "dev5"}


@pytest.mark.parametrize(
    ("available", "must", "size", "named"),
    [
        (["dev0", "dev1"], [], 3, "allocation_size 3"),
        (["dev0"], ["dev1"], 1, "dev1"),
        (["dev0", "zzz"], [], 1, "'zzz'"),
        (["dev0"], [], 0, "allocation_size 0"),
    ],
    ids=["too-big", "must-outside", "unknown", "zero"],
)
async def test_preferred_allocation_errors(
    fake_kubelet, plugin_runner, available, must, size, named
):
    await plugin_runner.start(Scripted(make_devices(RES, 2)))
    await fake_kubelet.wait_registered(RES)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.preferred_allocation(RES, available, must, size)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in err.value.details()


async def test_several_resources_from_one_backend(fake_kubelet, plugin_runner):
    devices = make_devices("example.com/a", 2, prefix="a") + make_devices(
        "example.com/b", 3, prefix="b"
    )
    await plugin_runner.start(Scripted(devices))
    await fake_kubelet.wait_devices("example.com/a", lambda d: len(d) == 2)
    await fake_kubelet.wait_devices("example.com/b", lambda d: len(d) == 3)
    resp = await fake_kubelet.allocate("example.com/b", ["b2"])
    assert resp.envs["VISIBLE"] == "2"
    with pytest.raises(grpc.aio.AioRpcError):
        await fake_kubelet.allocate("example.com/a", ["b2"])


async def test_recovery_event_during_a_slow_discovery_wins_over_its_stale_verdict(
    fake_kubelet, plugin_runner
):
    """A discovery that read 'unhealthy' before a healthy event must not undo the event."""
    import asyncio
    import threading

    from hetero_dp import hookimpl

    class Slow(Scripted):
        def __init__(self, devices):
            super().__init__(devices)
            self.entered = threading.Event()
            self.go = threading.Event()
            self.slow = False

        @hookimpl
        def discover(self):
            snapshot = list(self.devices)  # reads the state now ...
            if self.slow:
                self.entered.set()
                self.go.wait(10)  # ... and returns it later
            return snapshot

    devices = make_devices(RES, 2)
    backend = Slow(devices)
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(RES)
    assert backend.watch_started.wait(5)
    backend.devices = [devices[0].with_health(False, "driver unbound"), devices[1]]
    await daemon.rediscover()
    await fake_kubelet.wait_devices(RES, lambda d: not d["dev0"].healthy)
    backend.slow = True
    pending = asyncio.create_task(daemon.rediscover())
    assert await asyncio.to_thread(backend.entered.wait, 10)
    backend.devices = devices  # the driver is back; the event says so
    backend.sinks[0].set_health("dev0", True, "driver bound")
    await fake_kubelet.wait_devices(RES, lambda d: d["dev0"].healthy)
    backend.go.set()
    await pending  # publishes the stale snapshot: dev0 must stay healthy
    assert daemon.resources[RES].state.get("dev0").healthy
    await daemon.rediscover()  # a fresh discovery agrees
    assert daemon.resources[RES].state.get("dev0").healthy


async def test_health_event_during_a_slow_resource_defaults_hook_is_not_undone(
    fake_kubelet, plugin_runner
):
    """A publish that waits on a new resource's defaults must not overwrite a newer one."""
    import asyncio
    import threading

    from hetero_dp import hookimpl

    class SlowDefaults(Scripted):
        def __init__(self, devices):
            super().__init__(devices)
            self.entered = threading.Event()
            self.go = threading.Event()
            self.calls: list[str] = []

        @hookimpl
        def resource_defaults(self, resource):
            self.calls.append(resource)
            if resource == "example.com/late" and len(self.calls) == 2:
                self.entered.set()
                self.go.wait(10)  # only the first publish that needs it waits
            return {}

    devices = make_devices(RES, 2)
    backend = SlowDefaults(devices)
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2 and d["dev0"].healthy)
    assert backend.watch_started.wait(5)
    # the new resource's device comes first, so the publish waits before touching RES
    backend.devices = [*make_devices("example.com/late", 1, prefix="late"), *devices]
    pending = asyncio.create_task(daemon.rediscover())
    assert await asyncio.to_thread(backend.entered.wait, 10)
    backend.sinks[0].set_health("dev0", False, "XID 79")
    await fake_kubelet.wait_devices(RES, lambda d: not d["dev0"].healthy)
    backend.go.set()
    await pending  # it read dev0 healthy before the event: that view is stale now
    assert not daemon.resources[RES].state.get("dev0").healthy
    await fake_kubelet.wait_registered("example.com/late")


async def test_a_slow_discovery_that_ends_after_a_newer_one_is_dropped(fake_kubelet, plugin_runner):
    """Two discoveries overlap (rediscovery loop and a reload, say): the older result,
    arriving last, must not replace the newer device set."""
    import asyncio
    import threading

    from hetero_dp import hookimpl

    class Slow(Scripted):
        def __init__(self, devices):
            super().__init__(devices)
            self.entered = threading.Event()
            self.go = threading.Event()
            self.slow = False

        @hookimpl
        def discover(self):
            snapshot = list(self.devices)
            if self.slow:
                self.slow = False  # only the first of the two waits
                self.entered.set()
                self.go.wait(10)
            return snapshot

    backend = Slow(make_devices(RES, 2))
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    backend.slow = True
    older = asyncio.create_task(daemon.rediscover())
    assert await asyncio.to_thread(backend.entered.wait, 10)
    backend.devices = make_devices(RES, 3)
    await daemon.rediscover()  # the newer one finishes first
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 3)
    backend.go.set()
    await older  # read two devices before the third came
    assert len(daemon.resources[RES].state.devices) == 3


async def test_a_poll_verdict_on_a_device_removed_meanwhile_is_not_kept(
    fake_kubelet, plugin_runner
):
    """A device that left during a health poll comes back without that poll's verdict."""
    import asyncio
    import threading

    from hetero_dp import hookimpl

    class SlowPoll(Scripted):
        def __init__(self, devices):
            super().__init__(devices)
            self.entered = threading.Event()
            self.go = threading.Event()

        @hookimpl
        def check_health(self, device):
            self.entered.set()
            self.go.wait(10)
            return self.unhealthy.get(device.id, True)

    devices = make_devices(RES, 2)
    backend = SlowPoll(devices)
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    backend.unhealthy["dev1"] = "ECC errors"  # what the card says as it is unplugged
    poll = asyncio.create_task(daemon.poll_health())
    assert await asyncio.to_thread(backend.entered.wait, 10)
    backend.devices = devices[:1]
    await daemon.rediscover()
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 1)
    backend.go.set()
    await poll
    del backend.unhealthy["dev1"]  # a new card in its slot
    backend.devices = devices
    await daemon.rediscover()
    got = await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    assert got["dev1"].healthy
