"""Allocate answers that are reused (issue 26, the hot path): a repeated request is
answered from what was built for it before only while the device records hold; an
``allocate`` hook sees a fresh response on every call."""

from __future__ import annotations

import threading

import grpc
import pytest

from hetero_dp import ContainerResponse, Device, DeviceNode, EventSink, hookimpl

from .scripted import make_devices

RES = "example.com/accel"


class NoAllocateHook:
    """Devices and events only: Allocate is answered from the records alone."""

    hetero_dp_name = "plain"

    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices
        self.sinks: list[EventSink] = []
        self.watch_started = threading.Event()

    @hookimpl
    def discover(self) -> list[Device]:
        return list(self.devices)

    @hookimpl
    def watch(self, events: EventSink) -> None:
        self.sinks.append(events)
        self.watch_started.set()
        events.wait()


class CountingHook(NoAllocateHook):
    """An allocate hook that adds to the response on every call."""

    def __init__(self, devices: list[Device]) -> None:
        super().__init__(devices)
        self.calls = 0

    @hookimpl
    async def allocate(self, devices: list[Device], response: ContainerResponse) -> None:
        self.calls += 1
        response.envs["CALL"] = str(self.calls)
        response.envs["VISIBLE"] += ",hooked"
        response.devices.append(DeviceNode(f"/dev/extra{self.calls}"))


async def test_a_repeated_request_follows_health_and_rediscovery(fake_kubelet, plugin_runner):
    backend = NoAllocateHook(make_devices(RES, 2))
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(RES)
    first = await fake_kubelet.allocate(RES, ["dev1", "dev0"])
    assert dict(first.envs) == {"VISIBLE": "1,0", "DRIVER": "v1"}
    again = await fake_kubelet.allocate(RES, ["dev1", "dev0"])
    assert again.SerializeToString() == first.SerializeToString()

    # the device turns unhealthy: the same request is refused, naming it
    assert backend.watch_started.wait(5)
    backend.sinks[0].set_health("dev1", False, "XID 79")
    await fake_kubelet.wait_devices(RES, lambda d: not d["dev1"].healthy)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(RES, ["dev1", "dev0"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'dev1': XID 79" in err.value.details()

    backend.sinks[0].set_health("dev1", True, "recovered")
    await fake_kubelet.wait_devices(RES, lambda d: d["dev1"].healthy)
    assert (await fake_kubelet.allocate(RES, ["dev1", "dev0"])) == first

    # a record that changes (same IDs, same health) changes the answer
    backend.devices = [
        d
        if d.id != "dev0"
        else Device(id="dev0", resource=RES, nodes=(DeviceNode("/dev/dev0"),), env={"VISIBLE": "x"})
        for d in backend.devices
    ]
    await daemon.rediscover()
    changed = await fake_kubelet.allocate(RES, ["dev1", "dev0"])
    assert dict(changed.envs) == {"VISIBLE": "1,x", "DRIVER": "v1"}

    # a device that is gone is unknown
    backend.devices = backend.devices[:1]
    await daemon.rediscover()
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(RES, ["dev1", "dev0"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown devices: 'dev1'" in err.value.details()


async def test_an_allocate_hook_gets_a_fresh_response_every_call(fake_kubelet, plugin_runner):
    backend = CountingHook(make_devices(RES, 2))
    await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(RES)
    for call in (1, 2, 3):
        resp = await fake_kubelet.allocate(RES, ["dev0"])
        assert dict(resp.envs) == {"VISIBLE": "0,hooked", "DRIVER": "v1", "CALL": str(call)}
        assert [d.host_path for d in resp.devices] == [
            "/dev/dev0",
            "/dev/ctl",
            f"/dev/extra{call}",
        ]


class SwitchingHook(NoAllocateHook):
    """An allocate hook whose answer depends on a setting it reads (as nvidia's MPS
    plan, replaced by another thread), alike from call to call until it changes."""

    def __init__(self, devices: list[Device]) -> None:
        super().__init__(devices)
        self.mode = "a"

    @hookimpl
    async def allocate(self, devices: list[Device], response: ContainerResponse) -> None:
        response.envs["MODE"] = self.mode
        if self.mode == "b":
            response.devices.clear()


async def test_a_hook_whose_answer_changes_is_answered_with_the_change(fake_kubelet, plugin_runner):
    backend = SwitchingHook(make_devices(RES, 2))
    await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(RES)
    for mode, nodes in (("a", 2), ("a", 2), ("b", 0), ("b", 0), ("a", 2)):
        backend.mode = mode
        resp = await fake_kubelet.allocate(RES, ["dev0"])
        assert resp.envs["MODE"] == mode
        assert len(resp.devices) == nodes


class KeyedHook(SwitchingHook):
    """The same answers, and an ``allocate_key`` naming what they depend on."""

    def __init__(self, devices: list[Device]) -> None:
        super().__init__(devices)
        self.calls = 0
        self.key: object = "a"

    @hookimpl
    def allocate_key(self) -> object:
        if isinstance(self.key, Exception):
            raise self.key
        return self.key

    @hookimpl
    async def allocate(self, devices: list[Device], response: ContainerResponse) -> None:
        self.calls += 1
        await super().allocate(devices, response)


async def test_a_hook_with_a_key_is_called_again_only_when_the_key_or_the_records_change(
    fake_kubelet, plugin_runner
):
    backend = KeyedHook(make_devices(RES, 2))
    await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(RES)
    first = await fake_kubelet.allocate(RES, ["dev0"])
    for _ in range(3):
        assert (await fake_kubelet.allocate(RES, ["dev0"])) == first
    assert backend.calls == 1  # answered from the message built for the first call
    await fake_kubelet.allocate(RES, ["dev1"])  # another request: asked
    assert backend.calls == 2

    backend.mode = backend.key = "b"  # what the answer depends on changed, and the key
    resp = await fake_kubelet.allocate(RES, ["dev0"])
    assert resp.envs["MODE"] == "b" and len(resp.devices) == 0
    assert backend.calls == 3

    assert backend.watch_started.wait(5)  # the records change (health): asked again
    backend.sinks[0].set_health("dev1", False, "XID 79")
    await fake_kubelet.wait_devices(RES, lambda d: not d["dev1"].healthy)
    await fake_kubelet.allocate(RES, ["dev0"])
    assert backend.calls == 4


@pytest.mark.parametrize("key", [None, RuntimeError("no key today")], ids=["none", "raises"])
async def test_a_hook_whose_key_is_none_or_raises_is_called_every_time(
    fake_kubelet, plugin_runner, caplog, key
):
    backend = KeyedHook(make_devices(RES, 2))
    backend.key = key
    await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(RES)
    for call in (1, 2, 3):
        resp = await fake_kubelet.allocate(RES, ["dev0"])
        assert resp.envs["MODE"] == "a"
        assert backend.calls == call
    warned = [r for r in caplog.records if "allocate_key raised" in r.getMessage()]
    assert len(warned) == (1 if key is not None else 0)  # once, not per call
