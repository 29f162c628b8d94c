"""XID health through the watch hook: real pynvml event waits against the fake driver.

The backend reports the *GPU's* UUID; the framework fans that out to every
device whose ``parent`` is that GPU, so the MIG slices' records must carry it.
"""

from __future__ import annotations

import asyncio

import pytest
from hetero_dp_nvidia.backend import NvidiaBackend

from hetero_dp import Lost

XID = 0x8
DBE = 0x2


def started(node, env=None, **flags):
    b = NvidiaBackend(environ={"MIG_STRATEGY": "mixed", **(env or {})})
    b.configure({**node.options, **flags})
    devices = b.discover()
    b.monitor.wait_ms = 200  # only bounds how fast the thread sees stop; events wake it at once
    return b, devices


async def wait_blocked(lib):
    ok = await asyncio.to_thread(lib.fake_nvml_wait_waiters, 1, 5000)
    assert ok, "the watch thread is not blocked in nvmlEventSetWait"


async def test_xid79_marks_the_gpu_and_reaches_its_mig_slices(fake_node, watching):
    node = fake_node("a100-8x-nvlink.scn")
    b, devices = started(node)
    gpu0 = node.uuid(0)
    async with watching(b) as w:
        await wait_blocked(node.lib)
        assert node.lib.fake_nvml_inject_xid(0, 79) == 1
        uuid, healthy, reason = await w.next_health()
    b.shutdown()
    assert (uuid, healthy) == (gpu0, False)
    assert "XID 79 (GPU has fallen off the bus)" in reason and "fix:" in reason
    assert isinstance(reason, Lost)  # gone until reset: DRA taints it NoExecute
    # every MIG slice of GPU 0 (all four profiles) derives from the reported ID
    slices = [d for d in devices if d.physical_id == uuid]
    assert sorted(d.id for d in slices) == sorted(node.mig_uuids(0))
    assert {d.resource for d in slices} == {
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-3g.20gb",
    }
    assert "GPU has fallen off the bus" in (b.check_health(slices[0]) or "")


async def test_mig_instance_xid_marks_whole_gpu_with_instance_in_reason(fake_node, watching):
    node = fake_node("a100-8x-nvlink.scn")
    b, _ = started(node)
    async with watching(b) as w:
        await wait_blocked(node.lib)
        node.lib.fake_nvml_inject_event(0, XID, 94, 3, 0)
        uuid, healthy, reason = await w.next_health()
    b.shutdown()
    assert not isinstance(reason, Lost)  # a contained ECC error: unhealthy, not lost
    assert uuid == node.uuid(0) and not healthy
    assert "MIG GPU instance 3, compute instance 0" in reason


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
async def test_application_xids_are_ignored(fake_node, watching, xid):
    node = fake_node("h100-8x.scn")
    b, _ = started(node)
    async with watching(b) as w:
        await wait_blocked(node.lib)
        node.lib.fake_nvml_inject_xid(2, xid)
        # a real XID after it proves the ignored one was consumed, not just slow
        node.lib.fake_nvml_inject_xid(3, 48)
        uuid, healthy, reason = await w.next_health()
        assert w.health.empty()
    b.shutdown()
    assert (uuid, healthy) == (node.uuid(3), False)
    assert "XID 48 (double-bit ECC error)" in reason


async def test_disabled_xids_and_enabled_application_xid(fake_node, watching):
    node = fake_node("h100-8x.scn")
    b, _ = started(node, {"DP_DISABLE_HEALTHCHECKS": "79", "DP_ENABLE_HEALTHCHECKS": "13"})
    async with watching(b) as w:
        await wait_blocked(node.lib)
        node.lib.fake_nvml_inject_xid(1, 79)  # disabled by env
        node.lib.fake_nvml_inject_xid(1, 13)  # enabled by env
        uuid, healthy, reason = await w.next_health()
    b.shutdown()
    assert (uuid, healthy) == (node.uuid(1), False) and "XID 13" in reason


async def test_double_bit_ecc_event(fake_node, watching):
    node = fake_node("h100-8x.scn")
    b, _ = started(node)
    async with watching(b) as w:
        await wait_blocked(node.lib)
        node.lib.fake_nvml_inject_event(6, DBE, 0, 0xFFFFFFFF, 0xFFFFFFFF)
        uuid, healthy, reason = await w.next_health()
    b.shutdown()
    assert uuid == node.uuid(6) and not healthy and "double-bit ECC" in reason


async def test_gpu_lost_during_wait(fake_node, watching):
    node = fake_node("h100-8x.scn")
    b, _ = started(node)
    async with watching(b) as w:
        await wait_blocked(node.lib)
        node.lib.fake_nvml_set_lost(4, 1)
        uuid, healthy, reason = await w.next_health()
    b.shutdown()
    assert uuid == node.uuid(4) and not healthy
    assert "is lost" in reason and "nvidia-smi -r" in reason


async def test_recovery_after_quiet_period_and_probe(fake_node, watching):
    node = fake_node("a100-8x-nvlink.scn")
    b, _ = started(node, recoveryQuietPeriod=0.2)
    async with watching(b) as w:
        await wait_blocked(node.lib)
        node.lib.fake_nvml_inject_xid(0, 79)
        assert (await w.next_health())[:2] == (node.uuid(0), False)
        uuid, healthy, reason = await w.next_health()
    b.shutdown()
    assert (uuid, healthy) == (node.uuid(0), True)
    assert reason.startswith("recovered: no critical event for 0.2s and the probe passed")


async def test_no_recovery_while_the_probe_fails(fake_node, watching):
    node = fake_node("h100-8x.scn")
    b, devices = started(node, recoveryQuietPeriod=0.1)
    async with watching(b) as w:
        await wait_blocked(node.lib)
        node.lib.fake_nvml_set_lost(5, 1)
        assert (await w.next_health())[:2] == (node.uuid(5), False)
        # several quiet periods pass while the GPU stays lost: no recovery is reported
        with pytest.raises(asyncio.TimeoutError):
            await w.next_health(timeout=0.5)
        assert "is lost" in b.check_health(devices[5])
        node.lib.fake_nvml_set_lost(5, 0)  # the GPU answers again
        uuid, healthy, _ = await w.next_health()
    assert (uuid, healthy) == (node.uuid(5), True)
    assert b.check_health(devices[5]) is True
    b.shutdown()


async def test_recovery_disabled_keeps_gpu_unhealthy(fake_node, watching):
    node = fake_node("h100-8x.scn")
    b, devices = started(node, recoveryQuietPeriod=0)
    async with watching(b) as w:
        await wait_blocked(node.lib)
        node.lib.fake_nvml_inject_xid(0, 79)
        await w.next_health()
        with pytest.raises(asyncio.TimeoutError):
            await w.next_health(timeout=0.3)
    assert "XID 79" in b.check_health(devices[0])
    b.shutdown()


async def test_health_checks_disabled_entirely(fake_node, watching):
    node = fake_node("h100-8x.scn")
    b, devices = started(node, {"DP_DISABLE_HEALTHCHECKS": "all"})
    async with watching(b):
        assert node.lib.fake_nvml_inject_xid(0, 79) == 0  # nobody registered
    node.lib.fake_nvml_set_lost(0, 1)
    assert b.check_health(devices[0]) is True  # the poll is off too
    b.shutdown()


async def test_watch_returns_promptly_on_stop(fake_node, watching):
    node = fake_node("h100-8x.scn")
    b, _ = started(node)
    w = watching(b)
    await w.__aenter__()
    await wait_blocked(node.lib)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await w.__aexit__(None, None, None)
    assert loop.time() - t0 < 3 * b.monitor.wait_ms / 1000
    b.shutdown()


def test_check_health_probe(fake_node):
    node = fake_node("a100-8x-nvlink.scn")
    b, devices = started(node)
    gpu1 = next(d for d in devices if d.id == node.uuid(1))
    mig = next(d for d in devices if d.parent == node.uuid(0))
    assert b.check_health(gpu1) is True
    assert b.check_health(mig) is True
    node.lib.fake_nvml_set_lost(0, 1)
    assert "is lost" in b.check_health(mig)
    b.shutdown()


async def test_watch_starts_once_a_late_driver_comes_up(fake_node, watching):
    node = fake_node("h100-8x.scn", "init_error 9")
    b = NvidiaBackend(environ={"FAIL_ON_INIT_ERROR": "false"})
    b.configure(node.options)
    b.init_retry_s = 0.05
    assert b.discover() == []
    w = watching(b)
    sink_task = asyncio.ensure_future(asyncio.to_thread(b.watch, w.sink))
    # the driver gets loaded: the same node without the init error
    node.scenario.write_text(node.scenario.read_text().replace("init_error 9", ""))
    node.lib.fake_nvml_reset()
    assert len(b.discover()) == 8
    assert await asyncio.to_thread(b.monitor.ready.wait, 15)
    await wait_blocked(node.lib)
    node.lib.fake_nvml_inject_xid(7, 79)
    uuid, healthy, _ = await w.next_health()
    w.sink.stopping.set()
    await asyncio.wait_for(sink_task, 10)
    b.shutdown()
    assert (uuid, healthy) == (node.uuid(7), False)


async def test_reconfigure_while_watching_keeps_held_gpus_and_applies_new_settings(
    fake_node, watching
):
    # A config reload calls configure again while watch runs (hookspecs.configure).
    node = fake_node("h100-8x.scn")
    b, devices = started(node, recoveryQuietPeriod=0)
    async with watching(b) as w:
        await wait_blocked(node.lib)
        node.lib.fake_nvml_inject_xid(0, 79)
        assert (await w.next_health())[:2] == (node.uuid(0), False)
        b.configure({**node.options, "recoveryQuietPeriod": 0.2})
        # the GPU stays held by its event, though its probe passes
        assert "XID 79" in b.check_health(devices[0])
        # and the running thread follows the new recovery setting
        uuid, healthy, reason = await w.next_health()
    b.shutdown()
    assert (uuid, healthy) == (node.uuid(0), True)
    assert reason.startswith("recovered: no critical event for 0.2s")


async def test_hot_added_gpu_gets_xid_registration(fake_node, watching):
    # The scenario's last GPU is not there at start (fake's "present 7"), then appears.
    node = fake_node("h100-8x.scn", "present 7")
    b, devices = started(node)
    assert len(devices) == 7
    async with watching(b) as w:
        await wait_blocked(node.lib)
        assert node.lib.fake_nvml_inject_xid(7, 79) == 0  # nobody listens for it yet
        node.lib.fake_nvml_set_present(8)
        assert len(b.discover()) == 8  # the daemon's rediscovery
        assert await asyncio.to_thread(b.monitor.refreshed.wait, 5)
        assert node.uuid(7) in b.monitor.registered
        await wait_blocked(node.lib)
        assert node.lib.fake_nvml_inject_xid(7, 79) == 1
        uuid, healthy, reason = await w.next_health()
    b.shutdown()
    assert (uuid, healthy) == (node.uuid(7), False) and "XID 79" in reason
