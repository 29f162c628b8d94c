"""DRA features a device plugin cannot offer: partitionable devices (KEP-4815) and
sharing through consumable capacity (KEP-5075), each only where the server serves it."""

from __future__ import annotations

import logging
from typing import Any

import kubernetes_validate

from hetero_dp import Device, DeviceNode, hookimpl
from hetero_dp.dra import device_name
from hetero_dp.testing.dra import ClaimRef, FakeAPIServer, make_claim

from .backend import DRIVER, Npus

GPU_DRIVER = "gpu.nvidia.com"


def gpu_and_migs() -> list[Device]:
    """A MIG-capable GPU and two MIG devices, shaped as the nvidia backend's records
    (vendors/nvidia discovery.py: a MIG device's ``parent`` is its GPU's UUID and
    ``memoryMiB`` its own memory). Sizes of an A100 80GB: 1g.10gb, 3g.40gb."""
    gpu = Device(
        id="GPU-8a1f0c2e",
        resource="nvidia.com/gpu",
        index=0,
        nodes=(DeviceNode("/dev/nvidia0"),),
        attributes={"productName": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920},
    )
    migs = [
        Device(
            id=f"MIG-{profile}",
            resource="nvidia.com/gpu",
            parent=gpu.id,
            nodes=(DeviceNode("/dev/nvidia0"),),
            attributes={"migProfile": profile, "memoryMiB": mib},
        )
        for profile, mib in (("1g.10gb", 9856), ("3g.40gb", 40192))
    ]
    return [gpu, *migs]


class MigGpus:
    hetero_dp_name = "gpus"

    @hookimpl
    def discover(self) -> list[Device]:
        return gpu_and_migs()


async def test_a_mig_gpu_is_published_as_partitionable_and_a_profile_claimed(dra, kubelet):
    with FakeAPIServer(features=("DRAPartitionableDevices",)) as server:
        dra.api = server
        await dra.start(MigGpus(), driver_names={"nvidia.com/gpu": GPU_DRIVER})
        slices = server.slices_of(GPU_DRIVER)
        counters = [s for s in slices if s["spec"].get("sharedCounters")]
        devices = server.devices_of(GPU_DRIVER)
        assert len(slices) == 2 and len(counters) == 1  # counters live in a slice of their own
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
        gpu = device_name("GPU-8a1f0c2e")
        assert counters[0]["spec"]["sharedCounters"] == [
            {"name": gpu, "counters": {"memory": {"value": "80Gi"}}}
        ]
        assert devices[gpu]["consumesCounters"] == [
            {"counterSet": gpu, "counters": {"memory": {"value": "80Gi"}}}
        ]
        small = devices[device_name("MIG-1g.10gb")]
        assert small["consumesCounters"] == [
            {"counterSet": gpu, "counters": {"memory": {"value": "9856Mi"}}}
        ]
        assert small["attributes"]["migProfile"] == {"string": "1g.10gb"}
        for s in slices:
            assert kubernetes_validate.validate(s, "1.34", strict=True)

        # a claim of one MIG profile, as the scheduler allocates it
        await kubelet.wait_registered(GPU_DRIVER)
        claim = server.add_claim(
            make_claim("mig", [("mig", small["name"])], driver=GPU_DRIVER, pool="node-a")
        )
        [entry] = (await kubelet.prepare_pod("p", GPU_DRIVER, [ClaimRef.of(claim)])).values()
        assert entry.error == "" and [d.device_name for d in entry.devices] == [small["name"]]
        await dra.stop_all()


async def test_without_the_gate_partitions_are_plain_devices_and_the_log_says_so(
    dra, api_server, caplog
):
    with caplog.at_level(logging.INFO, logger="hetero_dp.dra"):
        await dra.start(MigGpus(), driver_names={"nvidia.com/gpu": GPU_DRIVER})
    assert "does not serve shared counters (DRAPartitionableDevices)" in caplog.text
    assert "may go to different claims" in caplog.text
    slices = api_server.slices_of(GPU_DRIVER)
    assert len(slices) == 1 and not slices[0]["spec"].get("sharedCounters")
    assert len(api_server.devices_of(GPU_DRIVER)) == 3


SHARING: dict[str, Any] = {
    "sharing": {"timeSlicing": {"resources": [{"name": "acme.example.com/npu", "replicas": 4}]}}
}


async def test_time_slicing_maps_onto_consumable_capacity(dra):
    with FakeAPIServer(features=("DRAConsumableCapacity",)) as server:
        dra.api = server
        await dra.start(Npus(1), config=SHARING)
        [d] = server.devices_of(DRIVER).values()
        assert d["allowMultipleAllocations"] is True
        assert d["capacity"]["timeSlices"] == {
            "value": "4",
            "requestPolicy": {"default": "1", "validRange": {"min": "1"}},
        }
        assert d["capacity"]["memory"]["value"] == "16Gi"
        assert d["capacity"]["memory"]["requestPolicy"]["default"] == "4Gi"  # a quarter each
        for s in server.slices_of(DRIVER):
            assert kubernetes_validate.validate(s, "1.34", strict=True)
        await dra.stop_all()


async def test_time_slicing_is_never_silently_ignored(dra, api_server, caplog):
    with caplog.at_level(logging.WARNING, logger="hetero_dp.dra"):
        await dra.start(Npus(2), config=SHARING)
    assert "sharing (time-slicing replicas) of 2 devices is not published" in caplog.text
    assert "DRAConsumableCapacity" in caplog.text
    assert all("allowMultipleAllocations" not in d for d in api_server.devices_of(DRIVER).values())
