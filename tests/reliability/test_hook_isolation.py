"""Hook calls that never return (a hung driver call is gone for good:
docs/sources.md#hung-calls). Only the device or request concerned suffers; the stuck
thread is replaced
so the rest of the backend keeps working; no second call for a stuck device
starts; past a cap the whole backend turns Unhealthy with the reason; a device
whose stuck call returns is judged again. And AllocationError keeps its code."""

from __future__ import annotations

import grpc
import pytest

from .conftest import SIM, Faulty, simulated

FAULTY = "example.com/faulty"
TIMEOUT = 0.3
CONFIG = {"hookTimeout": TIMEOUT}


async def _start(fake_kubelet, plugin_runner, backend):
    daemon = await plugin_runner.start(backend, simulated(), config=CONFIG)
    await fake_kubelet.wait_registered(FAULTY)
    await fake_kubelet.wait_registered(SIM)
    return daemon


def _health(devices):
    return {i: d.healthy for i, d in devices.items()}


async def test_one_hung_health_check_marks_only_its_device(fake_kubelet, plugin_runner):
    backend = Faulty(count=4)
    try:
        daemon = await _start(fake_kubelet, plugin_runner, backend)
        backend.hang_ids = {"dev2"}
        for _ in range(6):  # more polls than the pool has threads
            await daemon.poll_health()
        devices = await fake_kubelet.wait_devices(FAULTY, lambda d: not d["dev2"].healthy)
        assert _health(devices) == {"dev0": True, "dev1": True, "dev2": False, "dev3": True}
        reason = daemon.resources[FAULTY].state.get("dev2").reason
        assert "check_health" in reason and "dev2" in reason and "0.3s" in reason, reason
        # no second call started while the first is stuck
        assert backend.health_calls["dev2"] == 1
        # the rest of the backend still works: discovery, and health of the others
        await daemon.rediscover("faulty")
        await daemon.poll_health()
        assert backend.health_calls["dev0"] == 7 and backend.health_calls["dev2"] == 1
        resp = await fake_kubelet.allocate(FAULTY, ["dev1"])
        assert resp.envs["VISIBLE"] == "1"
        # the stuck call returns: the device is judged again, at once, without a poll
        backend.hang_ids.clear()
        backend.release()
        devices = await fake_kubelet.wait_devices(FAULTY, lambda d: d["dev2"].healthy)
        assert all(_health(devices).values())
    finally:
        backend.release()


async def test_hung_allocates_do_not_block_later_ones(fake_kubelet, plugin_runner):
    """Two Allocates hang (as many as the request pool has threads); the backend
    recovers; later Allocates work, and the devices never turned Unhealthy."""
    backend = Faulty(count=2)
    try:
        await _start(fake_kubelet, plugin_runner, backend)
        backend.mode["allocate"] = "hang"
        for ids in (["dev0"], ["dev1"]):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await fake_kubelet.allocate(FAULTY, ids, timeout=10)
            assert err.value.code() == grpc.StatusCode.INTERNAL
            assert "hook allocate timed out after 0.3s" in err.value.details()
        backend.mode.clear()  # recovered; the two stuck threads stay stuck
        for _ in range(3):
            resp = await fake_kubelet.allocate(FAULTY, ["dev0", "dev1"], timeout=10)
            assert resp.envs["VISIBLE"] == "0,1"
        assert fake_kubelet.resources[FAULTY].allocatable == 2
    finally:
        backend.release()


async def test_too_many_stuck_calls_turn_the_backend_unhealthy(fake_kubelet, plugin_runner):
    backend = Faulty(count=12)
    try:
        daemon = await _start(fake_kubelet, plugin_runner, backend)
        # more hung devices than the cap on stuck calls (8); dev10 and dev11 are fine
        backend.hang_ids = {f"dev{i}" for i in range(10)}
        await daemon.poll_health()
        await daemon.poll_health()
        devices = await fake_kubelet.wait_devices(
            FAULTY, lambda d: len(d) == 12 and not any(x.healthy for x in d.values())
        )
        assert len(devices) == 12
        reason = daemon.resources[FAULTY].state.get("dev11").reason
        assert "calls are stuck in the backend" in reason, reason
        threads_before = backend.health_calls.copy()
        await daemon.poll_health()  # refused up front: no thread grows
        assert backend.health_calls == threads_before
        # the other backend is untouched
        assert fake_kubelet.resources[SIM].allocatable == 4
        backend.hang_ids.clear()
        backend.release()  # the calls return: below the cap again, devices judged again
        await fake_kubelet.wait_devices(
            FAULTY, lambda d: len(d) == 12 and all(x.healthy for x in d.values())
        )
    finally:
        backend.release()


@pytest.mark.parametrize(
    ("mode", "code"),
    [
        ("refuse", grpc.StatusCode.FAILED_PRECONDITION),
        ("refuse-default", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_allocation_error_keeps_its_code_and_message(fake_kubelet, plugin_runner, mode, code):
    backend = Faulty(count=2)
    await _start(fake_kubelet, plugin_runner, backend)
    backend.mode["allocate"] = mode
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(FAULTY, ["dev0"])
    assert err.value.code() == code
    assert err.value.details() == "npu0 has no free queue"
    # a refusal is not a fault: the devices stay healthy
    assert fake_kubelet.resources[FAULTY].allocatable == 2


async def test_the_newest_verdict_wins_whatever_its_source(fake_kubelet, plugin_runner):
    """A poll finds dev0 broken; the backend's watch hook then reports it healthy: the
    kubelet sees it Healthy at once, not a poll interval later. A failure reported by
    an event after a healthy poll wins the same way."""
    backend = Faulty(count=2)
    daemon = await _start(fake_kubelet, plugin_runner, backend)
    await fake_kubelet.wait_for(lambda: daemon.runtimes["faulty"].sink is not None)
    sink = daemon.runtimes["faulty"].sink
    backend.mode["check_health"] = "raise"
    await daemon.poll_health()
    await fake_kubelet.wait_devices(FAULTY, lambda d: not d["dev0"].healthy)
    backend.mode.clear()  # the device is fine now; no poll runs (healthInterval 0)
    sink.set_health("dev0", True, "link retrained")
    await fake_kubelet.wait_devices(FAULTY, lambda d: d["dev0"].healthy, timeout=5)
    assert daemon.resources[FAULTY].state.get("dev0").reason == "link retrained"
    await daemon.poll_health()  # a healthy poll changes nothing the kubelet sees
    sink.set_health("dev0", False, "XID 79: fallen off the bus")
    await fake_kubelet.wait_devices(FAULTY, lambda d: not d["dev0"].healthy, timeout=5)
    assert "XID 79" in daemon.resources[FAULTY].state.get("dev0").reason
