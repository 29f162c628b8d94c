"""Partitions made on demand (the ``partitions``, ``prepare`` and ``unprepare`` hooks):
counter sets a backend declares, partitions published only where the server keeps
counters, and what prepare made undone on unprepare, after a restart and on failure."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator

import kubernetes_validate
import pytest_asyncio

from hetero_dp import Device, DeviceNode, hookimpl
from hetero_dp.dra import device_name
from hetero_dp.testing.dra import ClaimRef, FakeAPIServer, make_claim

from .backend import DRIVER, Npus

CARD = "NPU-0000"


class Carving(Npus):
    """One NPU of 4 cores; a partition is a run of cores, made when a claim is prepared
    (the shape of a MIG placement on memory slices, with a made-up device)."""

    def __init__(self) -> None:
        super().__init__(1)
        self.devices = [dataclasses.replace(self.devices[0], consumes=self.cores(0, 4))]
        self.made: dict[str, str] = {}  # partition ID -> claim UID
        self.unprepared: list[tuple[str, list[str]]] = []
        self.fail_unprepare = ""
        self.extra: list[Device] = []

    @staticmethod
    def cores(start: int, n: int) -> dict[str, int]:
        return {f"core-{i}": 1 for i in range(start, start + n)}

    @hookimpl
    def partitions(self, devices: list[Device]) -> list[Device]:
        out = [
            Device(
                id=f"{CARD}-p{start}x{n}",
                resource=devices[0].resource,
                parent=CARD,
                consumes=self.cores(start, n),
                attributes={"cores": n},
            )
            for n in (1, 2)
            for start in range(0, 4, n)
        ]
        return out + self.extra

    @hookimpl
    def prepare(self, claim: dict[str, str], devices: list[Device], config: list) -> list[Device]:
        out = []
        for d in devices:
            if d.parent:
                self.made[d.id] = claim["uid"]
                d = dataclasses.replace(d, nodes=(DeviceNode(f"/dev/npu0p{d.id[-3:]}"),))
            out.append(d)
        return out

    @hookimpl
    def unprepare(self, claim: dict[str, str], device_ids: list[str]) -> None:
        self.unprepared.append((claim["uid"], list(device_ids)))
        if self.fail_unprepare:
            raise RuntimeError(self.fail_unprepare)
        for i in device_ids:
            self.made.pop(i, None)


async def test_declared_counters_are_published_and_each_partition_draws_its_own(dra, kubelet):
    with FakeAPIServer(features=("DRAPartitionableDevices",)) as server:
        dra.api = server
        backend = Carving()
        backend.extra = [
            Device(id="stray", resource=backend.devices[0].resource, parent="NPU-9999"),
            Device(
                id=f"{CARD}-odd",
                resource=backend.devices[0].resource,
                parent=CARD,
                consumes={"core-9": 1},
            ),
        ]
        await dra.start(backend)
        slices = server.slices_of(DRIVER)
        for s in slices:
            assert kubernetes_validate.validate(s, "1.34", strict=True)
        [sets] = [s["spec"]["sharedCounters"] for s in slices if s["spec"].get("sharedCounters")]
        card = device_name(CARD)
        assert sets == [{"name": card, "counters": {f"core-{i}": {"value": "1"} for i in range(4)}}]
        devices = server.devices_of(DRIVER)
        # the card, 4 single cores, 2 pairs; the stray parent and the odd counter left out
        assert len(devices) == 7
        assert devices[device_name(f"{CARD}-p2x2")]["consumesCounters"] == [
            {"counterSet": card, "counters": {"core-2": {"value": "1"}, "core-3": {"value": "1"}}}
        ]
        assert set(devices[card]["consumesCounters"][0]["counters"]) == {
            f"core-{i}" for i in range(4)
        }
        await dra.stop_all()


async def test_partitions_follow_their_parents_health(dra, kubelet):
    with FakeAPIServer(features=("DRAPartitionableDevices",)) as server:
        dra.api = server
        backend = Carving()
        daemon = await dra.start(backend)
        assert len(server.devices_of(DRIVER)) == 7
        backend.unhealthy[CARD] = "core fault"
        await daemon.poll_health()
        await server.wait_for(lambda: len(server.devices_of(DRIVER)) == 0)
        await dra.stop_all()


async def test_a_partition_the_container_gate_refuses_is_left_out_and_logged(dra, kubelet, caplog):
    """Issue #29, one gate for everything a backend puts into a container: the
    partitions hook's records were published (and prepared into CDI specs) without
    the check every discovered record passes."""
    with FakeAPIServer(features=("DRAPartitionableDevices",)) as server:
        dra.api = server
        backend = Carving()
        backend.extra = [
            Device(
                id=f"{CARD}-evil",
                resource=backend.devices[0].resource,
                parent=CARD,
                consumes={"core-0": 1},
                nodes=(DeviceNode("/etc/shadow", "/dev/npu0"),),
            )
        ]
        with caplog.at_level(logging.ERROR, logger="hetero_dp.dra"):
            await dra.start(backend)
        devices = server.devices_of(DRIVER)
        assert len(devices) == 7 and device_name(f"{CARD}-evil") not in devices
        assert f"partition {CARD}-evil holds what may not go into a container" in caplog.text
        assert "nodes[0]: hostPath '/etc/shadow' is not under /dev" in caplog.text
        await dra.stop_all()


async def test_without_the_gate_declared_partitions_are_left_out_and_the_log_says_so(
    dra, api_server, caplog
):
    with caplog.at_level(logging.WARNING, logger="hetero_dp.dra"):
        await dra.start(Carving())
    assert "6 partitions (as NPU-0000-p0x1) are not published" in caplog.text
    assert list(api_server.devices_of(DRIVER)) == [device_name(CARD)]


@pytest_asyncio.fixture
async def carving(dra, kubelet) -> AsyncIterator[tuple[FakeAPIServer, Carving]]:
    """A Carving backend served, registered, against a server with counters."""
    with FakeAPIServer(features=("DRAPartitionableDevices",)) as server:
        dra.api = server
        backend = Carving()
        await dra.start(backend)
        await kubelet.wait_registered(DRIVER)
        yield server, backend
        await dra.stop_all()


async def test_unprepare_undoes_what_prepare_made_also_after_a_restart(dra, kubelet, carving):
    server, backend = carving
    part = device_name(f"{CARD}-p0x2")
    ref = ClaimRef.of(
        server.add_claim(make_claim("c", [("npu", part)], driver=DRIVER, pool="node-a"))
    )
    entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
    assert entry.error == "" and backend.made == {f"{CARD}-p0x2": ref.uid}

    await dra.stop_all()
    again = Carving()
    again.made = dict(backend.made)  # what is on the device survives the process
    again.fail_unprepare = "partition busy"
    await dra.start(again)
    await kubelet.wait_registered(DRIVER)
    failed = (await kubelet.node_unprepare(DRIVER, [ref])).claims[ref.uid].error
    assert "partition busy" in failed
    assert again.unprepared == [(ref.uid, [f"{CARD}-p0x2"])]
    again.fail_unprepare = ""  # the kubelet retries: the checkpoint still holds it
    assert (await kubelet.node_unprepare(DRIVER, [ref])).claims[ref.uid].error == ""
    assert again.made == {}
    # unprepared: a retry has nothing left to undo
    assert (await kubelet.node_unprepare(DRIVER, [ref])).claims[ref.uid].error == ""
    assert len(again.unprepared) == 2


async def test_a_prepare_that_fails_after_the_hook_undoes_what_it_made(dra, kubelet, carving):
    server, backend = carving
    dra.cdi_dir.mkdir(parents=True, exist_ok=True)
    dra.cdi_dir.rmdir()
    dra.cdi_dir.write_text("")  # the claim's CDI spec cannot be written
    part = f"{CARD}-p3x1"
    ref = ClaimRef.of(
        server.add_claim(
            make_claim("c", [("npu", device_name(part))], driver=DRIVER, pool="node-a")
        )
    )
    assert (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid].error
    assert backend.unprepared == [(ref.uid, [part])] and backend.made == {}
