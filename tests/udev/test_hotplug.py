"""Hotplug and health through the watch hook: umockdev uevents reach a real
pyudev.Monitor on the event loop and come out of the EventSink."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hetero_dp_udev import UdevBackend
from hetero_dp_udev.backend import options
from hetero_dp_udev.testing import Testbed

from hetero_dp import Device, EventSink

pytestmark = pytest.mark.umockdev

TIMEOUT = 5.0
GPU_43 = "/sys/devices/pci0000:40/0000:40:01.1/0000:43:00.0"
GPU_C3 = "/sys/devices/pci0000:c0/0000:c0:03.1/0000:c3:00.0"
GAUDI_33 = "/sys/devices/pci0000:30/0000:30:01.0/0000:33:00.0"

NEW_GPU = """P: /devices/pci0000:80/0000:80:01.1
E: SUBSYSTEM=pci
E: DRIVER=pcieport
A: vendor=0x1022
A: device=0x1483
A: numa_node=1
L: driver=../../../bus/pci/drivers/pcieport

P: /devices/pci0000:80/0000:80:01.1/0000:83:00.0
E: SUBSYSTEM=pci
E: DRIVER=amdgpu
A: vendor=0x1002
A: device=0x740f
A: class=0x038000
A: numa_node=1
L: driver=../../../../bus/pci/drivers/amdgpu

P: /devices/pci0000:80/0000:80:01.1/0000:83:00.0/drm/card3
N: dri/card3
E: SUBSYSTEM=drm
E: DEVNAME=/dev/dri/card3

P: /devices/pci0000:80/0000:80:01.1/0000:83:00.0/drm/renderD130
N: dri/renderD130
E: SUBSYSTEM=drm
E: DEVNAME=/dev/dri/renderD130
"""


class Recorder:
    """An EventSink whose events land in a queue the test awaits."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[object, ...]] = asyncio.Queue()
        self.sink = EventSink(
            asyncio.get_running_loop(),
            on_health=lambda i, h, r: self.queue.put_nowait(("health", i, h, r)),
            on_rediscover=lambda: self.queue.put_nowait(("rediscover",)),
        )

    async def next(self, kind: str) -> tuple[object, ...]:
        async def matching() -> tuple[object, ...]:
            while True:
                event = await self.queue.get()
                if event[0] == kind:
                    return event

        # asyncio.timeout() is 3.11+; wait_for() is on every Python we support
        return await asyncio.wait_for(matching(), TIMEOUT)

    def drain(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()


async def _watching(backend: UdevBackend) -> AsyncIterator[Recorder]:
    recorder = Recorder()
    task = asyncio.ensure_future(backend.watch(recorder.sink))
    # watch() runs synchronously up to its first await, where the monitor is on
    # the loop; one turn of the loop gets it there (no timing involved).
    await asyncio.sleep(0)
    assert not task.done(), task
    try:
        yield recorder
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def amd(testbed: Testbed, data: Path) -> AsyncIterator[tuple[UdevBackend, Recorder]]:
    testbed.add_file(data / "amd-gpu.umockdev")
    backend = UdevBackend()
    backend.configure(options({"rules": ["amd-gpu"]}))
    assert len(backend.discover()) == 2
    async for recorder in _watching(backend):
        yield backend, recorder


async def test_hotplug_add_and_remove_reach_the_sink(
    testbed: Testbed, amd: tuple[UdevBackend, Recorder]
) -> None:
    backend, recorder = amd
    testbed.add(NEW_GPU)
    await recorder.next("rediscover")
    devices = {d.id: d for d in backend.discover()}
    assert sorted(devices) == ["0000:43:00.0", "0000:83:00.0", "0000:c3:00.0"]
    assert [n.host_path for n in devices["0000:83:00.0"].nodes if not n.shared] == [
        "/dev/dri/card3",
        "/dev/dri/renderD130",
    ]
    assert devices["0000:83:00.0"].healthy and devices["0000:83:00.0"].numa_nodes == (1,)

    recorder.drain()
    testbed.remove("/sys/devices/pci0000:80/0000:80:01.1/0000:83:00.0")
    await recorder.next("rediscover")
    assert sorted(d.id for d in backend.discover()) == ["0000:43:00.0", "0000:c3:00.0"]


async def test_driver_unbind_marks_unhealthy_and_rebind_recovers(
    testbed: Testbed, amd: tuple[UdevBackend, Recorder]
) -> None:
    backend, recorder = amd
    testbed.unbind_driver(GPU_43)
    assert await recorder.next("health") == (
        "health",
        "0000:43:00.0",
        False,
        "no driver bound to 0000:43:00.0 (usable: amdgpu)",
    )
    await recorder.next("rediscover")
    devices = {d.id: d for d in backend.discover()}
    # still listed (capacity kept), but no longer allocatable
    assert not devices["0000:43:00.0"].healthy
    assert devices["0000:43:00.0"].reason == "no driver bound to 0000:43:00.0 (usable: amdgpu)"
    assert devices["0000:c3:00.0"].healthy

    testbed.bind_driver(GPU_43, "amdgpu")
    event = await recorder.next("health")
    assert event[1:3] == ("0000:43:00.0", True)
    assert "recovered" in str(event[3])
    assert all(d.healthy for d in backend.discover())


async def test_node_removed_makes_the_device_unhealthy(
    testbed: Testbed, amd: tuple[UdevBackend, Recorder]
) -> None:
    backend, recorder = amd
    device = next(d for d in backend.discover() if d.id == "0000:43:00.0")
    assert backend.check_health(device) is True
    testbed.remove(GPU_43 + "/drm/renderD129")
    assert backend.check_health(device) == "device node /dev/dri/renderD129 is gone"
    await recorder.next("rediscover")
    again = next(d for d in backend.discover() if d.id == "0000:43:00.0")
    assert not again.healthy
    assert again.reason == "device node /dev/dri/renderD129 is gone"


@pytest.fixture
async def gaudi(
    testbed: Testbed, data: Path, tmp_path: Path
) -> AsyncIterator[tuple[UdevBackend, Recorder]]:
    testbed.add_file(data / "gaudi.umockdev")
    for pci in (
        GAUDI_33,
        GAUDI_33.replace("30:01.0/0000:33", "97:01.0/0000:9a").replace("pci0000:30", "pci0000:97"),
    ):
        testbed.set_attribute(pci, "status", "operational", event=False)
    rules = tmp_path / "gaudi-health.yaml"
    rules.write_text(
        "resources:\n"
        "  - name: habana.ai/gaudi\n"
        "    match: {subsystem: accel, sysname: 'accel[0-9]*', vendor: '0x1da3'}\n"
        "    health: {attribute: status, equals: operational, target: pci, interval: 0.05}\n"
    )
    backend = UdevBackend()
    backend.configure(options({"rules": str(rules)}))
    assert [d.healthy for d in backend.discover()] == [True, True]
    async for recorder in _watching(backend):
        yield backend, recorder


async def test_attribute_flip_with_change_event(
    testbed: Testbed, gaudi: tuple[UdevBackend, Recorder]
) -> None:
    backend, recorder = gaudi
    testbed.set_attribute(GAUDI_33, "status", "in reset")
    assert await recorder.next("health") == (
        "health",
        "0000:33:00.0",
        False,
        "health attribute status='in reset', expected 'operational'",
    )
    device = next(d for d in backend.discover() if d.id == "0000:33:00.0")
    assert not device.healthy
    assert backend.check_health(device) == device.reason

    testbed.set_attribute(GAUDI_33, "status", "operational")
    event = await recorder.next("health")
    assert event[1:3] == ("0000:33:00.0", True)
    assert [d.healthy for d in backend.discover()] == [True, True]


async def test_attribute_flip_without_event_is_caught_by_the_interval(
    testbed: Testbed, gaudi: tuple[UdevBackend, Recorder]
) -> None:
    _, recorder = gaudi
    testbed.set_attribute(GAUDI_33, "status", "needs reset", event=False)
    event = await recorder.next("health")
    assert event[1:3] == ("0000:33:00.0", False)
    await recorder.next("rediscover")  # the discovered verdicts follow
    testbed.set_attribute(GAUDI_33, "status", "operational", event=False)
    event = await recorder.next("health")
    assert event[1:3] == ("0000:33:00.0", True)


async def test_recovery_seen_only_by_discovery_clears_the_reported_problem(
    testbed: Testbed, gaudi: tuple[UdevBackend, Recorder]
) -> None:
    backend, recorder = gaudi
    testbed.set_attribute(GAUDI_33, "status", "in reset")
    assert (await recorder.next("health"))[1:3] == ("0000:33:00.0", False)
    testbed.set_attribute(GAUDI_33, "status", "operational", event=False)
    assert [d.healthy for d in backend.discover()] == [True, True]
    event = await recorder.next("health")
    assert event[1:3] == ("0000:33:00.0", True)
    assert event[3] == "recovered (health attribute status='in reset', expected 'operational')"


async def test_reconfigure_while_watching_follows_the_new_rules(
    testbed: Testbed, gaudi: tuple[UdevBackend, Recorder], tmp_path: Path
) -> None:
    # A config reload calls configure again while watch runs (hookspecs.configure).
    backend, recorder = gaudi
    rules = tmp_path / "gaudi-reloaded.yaml"
    rules.write_text((tmp_path / "gaudi-health.yaml").read_text())
    backend.configure(options({"rules": str(rules)}))
    assert [d.healthy for d in backend.discover()] == [True, True]
    recorder.drain()
    testbed.set_attribute(GAUDI_33, "status", "needs reset", event=False)
    event = await recorder.next("health")  # the new rules' interval is running
    assert event[1:3] == ("0000:33:00.0", False)


async def test_unbound_and_vfio_stay_unhealthy_until_bound_again(
    testbed: Testbed, data: Path
) -> None:
    # The old bug: the bridge's pcieport was taken for the device's driver, so an
    # unbound card "recovered" at the next discovery and vfio-pci counted as bound.
    testbed.add_file(data / "gaudi.umockdev")
    backend = UdevBackend()
    backend.configure(options({"rules": ["gaudi"]}))
    assert [d.healthy for d in backend.discover()] == [True, True]
    async for recorder in _watching(backend):
        testbed.unbind_driver(GAUDI_33)
        reason = "no driver bound to 0000:33:00.0 (usable: habanalabs)"
        assert await recorder.next("health") == ("health", "0000:33:00.0", False, reason)
        for _ in range(2):  # every later discovery and poll keeps the verdict
            device = next(d for d in backend.discover() if d.id == "0000:33:00.0")
            assert (device.healthy, device.reason) == (False, reason)
            assert backend.check_health(device) == reason
        testbed.bind_driver(GAUDI_33, "vfio-pci")
        vfio = "0000:33:00.0 is bound to vfio-pci, not a usable driver (habanalabs)"
        assert await recorder.next("health") == ("health", "0000:33:00.0", False, vfio)
        device = next(d for d in backend.discover() if d.id == "0000:33:00.0")
        assert (device.healthy, device.reason) == (False, vfio)
        testbed.bind_driver(GAUDI_33, "habanalabs")
        event = await recorder.next("health")
        assert event[1:3] == ("0000:33:00.0", True)
        assert all(d.healthy for d in backend.discover())


def _snapshot(devices: list[Device]) -> list[tuple[object, ...]]:
    return [(d.resource, d.id, d.healthy, d.reason, d.nodes, d.env, d.index) for d in devices]


async def test_an_event_looks_only_at_the_device_it_names(
    testbed: Testbed, amd: tuple[UdevBackend, Recorder]
) -> None:
    backend, recorder = amd
    # A change nobody announces (no uevent) on one GPU is invisible to a discovery
    # caused by another GPU's event: that discovery did not rescan the machine.
    testbed.set_attribute(GPU_C3, "class", "0x040300", event=False)  # now "audio"
    testbed.add(NEW_GPU)
    await recorder.next("rediscover")
    after_event = {d.id: d for d in backend.discover()}
    assert sorted(after_event) == ["0000:43:00.0", "0000:83:00.0", "0000:c3:00.0"]
    assert after_event["0000:c3:00.0"].healthy
    # A discovery without events behind it (the framework's interval) scans all.
    swept = {d.id: d for d in backend.discover()}
    assert not swept["0000:c3:00.0"].healthy
    assert "no longer matches" in swept["0000:c3:00.0"].reason


async def test_change_events_of_other_devices_cost_no_discovery(
    testbed: Testbed, amd: tuple[UdevBackend, Recorder]
) -> None:
    """A change on a device no rule matches (the BMC's VGA card, on the drm subsystem
    the monitor listens to) is read and left alone: no batch, no discovery. A change
    on a found GPU still is one."""
    backend, recorder = amd
    bmc_card = "/sys/devices/pci0000:00/0000:00:1c.0/0000:02:00.0/drm/card0"
    before = backend._event_batches
    for _ in range(3):
        testbed.uevent(bmc_card, "change")
    testbed.uevent(GPU_C3, "change")
    await recorder.next("rediscover")
    assert backend._event_batches == before + 1
    # the GPU's change waits for the discovery; the VGA card's was never queued
    assert GPU_C3 in backend._dirty and bmc_card not in backend._dirty


async def test_incremental_discovery_equals_a_full_scan(
    testbed: Testbed, data: Path, amd: tuple[UdevBackend, Recorder]
) -> None:
    # On Python 3.10 under umockdev, once the second Context below has enumerated,
    # libudev drops the next remove uevent (reproduced with pyudev alone; 3.11+
    # receive it): the monitor wakes, yields no device, and the backend rescans
    # everything, so the removals below reach the sink on every Python.
    backend, recorder = amd
    testbed.add(NEW_GPU)
    await recorder.next("rediscover")
    incremental = backend.discover()
    fresh = UdevBackend()
    fresh.configure(options({"rules": ["amd-gpu"]}))
    assert _snapshot(incremental) == _snapshot(fresh.discover())
    recorder.drain()
    testbed.remove(GPU_43 + "/drm/renderD129")
    await recorder.next("rediscover")
    nodes = {d.id: [n.host_path for n in d.nodes] for d in backend.discover()}
    assert "/dev/dri/renderD129" in nodes["0000:43:00.0"]  # remembered, reported gone
    recorder.drain()
    testbed.remove("/sys/devices/pci0000:80/0000:80:01.1/0000:83:00.0")
    await recorder.next("rediscover")
    assert [d.id for d in backend.discover()] == ["0000:43:00.0", "0000:c3:00.0"]


async def test_gaudi_control_node_arriving_late_is_paired(testbed: Testbed, data: Path) -> None:
    # The driver creates accel<N> and the parentless control node one after the
    # other; a discovery between the two events must not keep the device short.
    text = (data / "gaudi.umockdev").read_text()
    blocks = text.split("\n\n")
    late = [b for b in blocks if "accel_controlD1" in b]
    testbed.add("\n\n".join(b for b in blocks if b not in late))
    backend = UdevBackend()
    backend.configure(options({"rules": ["gaudi"]}))
    devices = {d.id: d for d in backend.discover()}
    assert [n.host_path for n in devices["0000:9a:00.0"].nodes] == ["/dev/accel/accel1"]
    async for recorder in _watching(backend):
        testbed.add(late[0])
        await recorder.next("rediscover")
        devices = {d.id: d for d in backend.discover()}
        assert [n.host_path for n in devices["0000:9a:00.0"].nodes] == [
            "/dev/accel/accel1",
            "/dev/accel/accel_controlD1",
        ]


def _boom(*args: object, **kwargs: object) -> bool:
    raise RuntimeError("boom")


async def test_a_failure_handling_events_is_one_line_and_a_rediscovery(
    testbed: Testbed,
    amd: tuple[UdevBackend, Recorder],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue #29: an exception while handling a batch of uevents was asyncio's
    multi-line traceback per batch and no rediscovery (the hotplug went unseen until the next
    rediscoverInterval). Now it is one line and a full rediscovery, and the monitor
    stays on the loop for the next events."""
    backend, recorder = amd
    monkeypatch.setattr(backend, "_new_batch", _boom)
    testbed.add(NEW_GPU)
    await recorder.next("rediscover")
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert errors  # one line per batch of events (umockdev sends the GPU's in several)
    for r in errors:
        assert r.exc_info is None
        assert r.getMessage() == (
            "udev monitor: handling events failed (RuntimeError('boom')); rediscovering all"
        )
    assert "0000:83:00.0" in {d.id for d in backend.discover()}
    monkeypatch.undo()
    recorder.drain()
    testbed.remove("/sys/devices/pci0000:80/0000:80:01.1/0000:83:00.0")
    await recorder.next("rediscover")  # still watching
    assert "0000:83:00.0" not in {d.id for d in backend.discover()}


async def test_a_health_check_that_raises_does_not_end_the_rules_timer(
    testbed: Testbed,
    gaudi: tuple[UdevBackend, Recorder],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue #29: a health check that raised ended the rule's interval timer in
    silence (a flip without a uevent was never seen again). Now it logs, asks for a
    rediscovery and keeps checking."""
    _, recorder = gaudi
    monkeypatch.setattr(gaudi[0], "_report", _boom)
    for _ in range(3):
        await recorder.next("rediscover")
    failed = [r for r in caplog.records if "health check failed" in r.getMessage()]
    # the same failure three times: one ERROR, the repeats at debug
    assert [r.levelno for r in failed if r.levelno >= logging.ERROR] == [logging.ERROR]
    monkeypatch.undo()
    recorder.drain()
    testbed.set_attribute(GAUDI_33, "status", "needs reset", event=False)
    event = await recorder.next("health")  # the timer still runs
    assert event[1:3] == ("0000:33:00.0", False)
