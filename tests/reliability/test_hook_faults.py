"""A backend hook that raises, hangs past ``hookTimeout`` or returns garbage: the
fault is contained to that backend's devices, reported (log and ``hook_error``
event), the devices turn Unhealthy with the reason, and the daemon keeps serving
every other resource. When the hook behaves again, the devices recover."""

from __future__ import annotations

import time

import grpc
import pytest

from hetero_dp.kits import observe

from .conftest import SIM, simulated, vitals

FAULTY = "example.com/faulty"
TIMEOUT = 0.3
CONFIG = {"hookTimeout": TIMEOUT}
REASONS = {"raise": "exploded", "hang": "timed out after 0.3s", "garbage": "returned"}


@pytest.fixture
def hook_errors():
    seen = []
    unsubscribe = observe.subscribe(
        lambda event, fields: seen.append(fields) if event == "hook_error" else None
    )
    yield seen
    unsubscribe()


async def _start(fake_kubelet, plugin_runner, faulty):
    daemon = await plugin_runner.start(faulty, simulated(), config=CONFIG)
    await fake_kubelet.wait_registered(FAULTY)
    await fake_kubelet.wait_registered(SIM)
    return daemon


async def _still_serving(fake_kubelet):
    """The other backend's resource is untouched: healthy, streaming, allocating."""
    res = fake_kubelet.resources[SIM]
    assert res.stream_open and res.allocatable == 4
    resp = await fake_kubelet.allocate(SIM, ["sim0"], timeout=5)
    assert resp.envs["SIM_VISIBLE_DEVICES"] == "0"


def _all_unhealthy(d):
    return len(d) == 2 and not any(x.healthy for x in d.values())


def _all_healthy(d):
    return len(d) == 2 and all(x.healthy for x in d.values())


@pytest.mark.parametrize("mode", ["raise", "hang", "garbage"])
async def test_check_health_fault(fake_kubelet, plugin_runner, faulty, hook_errors, mode):
    daemon = await _start(fake_kubelet, plugin_runner, faulty)
    faulty.mode["check_health"] = mode
    start = time.monotonic()
    await daemon.poll_health()
    assert time.monotonic() - start < TIMEOUT + 2, "a hung hook must not hold the poll"
    await fake_kubelet.wait_devices(FAULTY, _all_unhealthy)
    reason = daemon.resources[FAULTY].state.get("dev0").reason
    assert REASONS[mode] in reason and "check_health" in reason, reason
    assert {e["hook"] for e in hook_errors} == {"check_health"}
    assert {e["backend"] for e in hook_errors} == {"faulty"}
    # the kubelet is told why when it asks for the device anyway
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(FAULTY, ["dev1"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert REASONS[mode] in err.value.details()
    await _still_serving(fake_kubelet)
    # the hook behaves again: the devices come back
    faulty.mode.clear()
    faulty.release()
    await daemon.poll_health()
    await fake_kubelet.wait_devices(FAULTY, _all_healthy)


@pytest.mark.parametrize("mode", ["raise", "hang", "garbage"])
async def test_discover_fault(fake_kubelet, plugin_runner, faulty, hook_errors, mode):
    daemon = await _start(fake_kubelet, plugin_runner, faulty)
    faulty.mode["discover"] = mode
    await daemon.rediscover("faulty")
    # the devices it knew stay in capacity, unhealthy, with the reason
    await fake_kubelet.wait_devices(FAULTY, _all_unhealthy)
    reason = daemon.resources[FAULTY].state.get("dev1").reason
    assert reason.startswith("discovery failed") and REASONS[mode][:8] in reason, reason
    assert [e["hook"] for e in hook_errors] == ["discover"]
    await _still_serving(fake_kubelet)
    faulty.mode.clear()
    faulty.release()
    await daemon.rediscover("faulty")
    await fake_kubelet.wait_devices(FAULTY, _all_healthy)


@pytest.mark.parametrize("mode", ["raise", "hang", "garbage"])
async def test_allocate_fault(fake_kubelet, plugin_runner, faulty, mode):
    await _start(fake_kubelet, plugin_runner, faulty)
    faulty.mode["allocate"] = mode
    start = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(FAULTY, ["dev0", "dev1"], timeout=10)
    assert time.monotonic() - start < TIMEOUT + 2, "the kubelet has no Allocate deadline"
    details = err.value.details()
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "Traceback" not in details and FAULTY in details
    if mode != "garbage":  # garbage is caught turning the response into protobuf
        assert "'dev0', 'dev1'" in details and "faulty" in details
        assert "hook allocate" in details  # names the hook (and, on a hang, the limit)
    await _still_serving(fake_kubelet)
    faulty.mode.clear()
    faulty.release()
    resp = await fake_kubelet.allocate(FAULTY, ["dev1"])
    assert resp.envs["VISIBLE"] == "1"
    assert fake_kubelet.registration_count(FAULTY) == 1  # no restart was needed


async def test_watch_raises_then_restarts(fake_kubelet, plugin_runner, faulty, hook_errors):
    faulty.watch_failures = 1
    await _start(fake_kubelet, plugin_runner, faulty)
    await fake_kubelet.wait_devices(FAULTY, _all_unhealthy)
    assert [e["hook"] for e in hook_errors] == ["watch"]
    await _still_serving(fake_kubelet)
    # restarted after its backoff (1 s): the fault clears
    await fake_kubelet.wait_devices(FAULTY, _all_healthy, timeout=10)
    assert faulty.watch_calls == 2 and faulty.watch_running.is_set()


async def test_hanging_hook_threads_stay_bounded(fake_kubelet, plugin_runner, faulty):
    """Hook threads that never return do not pile up, however often they are polled."""
    daemon = await _start(fake_kubelet, plugin_runner, faulty)
    base = vitals().threads
    faulty.mode["check_health"] = "hang"
    for _ in range(6):
        await daemon.poll_health()
    assert vitals().threads <= base + 4  # the backend's worker pool, no more
    await fake_kubelet.wait_devices(FAULTY, _all_unhealthy)
    await _still_serving(fake_kubelet)
