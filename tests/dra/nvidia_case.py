"""The NVIDIA backend, unchanged, served as a DRA driver: NVML answered by the fake
libnvidia-ml through real pynvml, slices checked against the 1.34 schema, a claim
prepared into a CDI spec, and an XID 79 withdrawing the GPU from the pool.

Run by test_nvidia_dra.py in a pytest of its own: the fake libnvidia-ml is loaded
once per process, and tests/nvidia loads its own copy in the main run.
"""

from __future__ import annotations

import asyncio
import ctypes

import kubernetes_validate
import pytest

from hetero_dp.dra import device_name
from hetero_dp.testing.dra import ClaimRef, make_claim
from tests.cdi.schema_check import assert_valid_cdi_spec

pytest.importorskip("hetero_dp_nvidia")
from hetero_dp_nvidia.backend import NvidiaBackend

DRIVER = "gpu.nvidia.com"


async def test_gpus_as_dra_devices_prepare_and_xid(dra, kubelet, api_server, fake_node):
    node = fake_node("h100-8x.scn")
    backend = NvidiaBackend(environ={})
    await dra.start(backend, options={"nvidia": {**node.options, "recoveryQuietPeriod": 60}})
    backend.monitor.wait_ms = 200
    await kubelet.wait_registered(DRIVER)

    [s] = api_server.slices_of(DRIVER)
    assert kubernetes_validate.validate(s, "1.34", strict=True)
    devices = api_server.devices_of(DRIVER)
    assert set(devices) == {device_name(g["uuid"]) for g in node.gpus}
    gpu2 = devices[device_name(node.uuid(2))]
    attrs = gpu2["attributes"]
    assert attrs["uuid"] == {"string": node.uuid(2)}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": "550.54.15"}
    assert attrs["pciAddress"] == {"string": "0000:47:00.0"}
    assert attrs["numaNode"] == {"int": 0}
    assert gpu2["capacity"] == {"memory": {"value": "81559Mi"}}

    ref = ClaimRef.of(
        api_server.add_claim(
            make_claim("train", [("gpu", device_name(node.uuid(2)))], driver=DRIVER, pool="node-a")
        )
    )
    entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
    assert entry.error == ""
    [cdi_id] = entry.devices[0].cdi_device_ids
    [path] = dra.cdi_dir.glob("hetero-dp-dra_*.json")
    spec = assert_valid_cdi_spec(path)
    [dev] = [d for d in spec["devices"] if f"{spec['kind']}={d['name']}" == cdi_id]
    assert f"NVIDIA_VISIBLE_DEVICES={node.uuid(2)}" in dev["containerEdits"]["env"]

    assert await asyncio.to_thread(backend.monitor.ready.wait, 10)
    assert await asyncio.to_thread(node.lib.fake_nvml_wait_waiters, 1, 5000)
    node.lib.fake_nvml_inject_xid(5, 79)  # GPU 5 fell off the bus
    gone = device_name(node.uuid(5))
    await api_server.wait_for(lambda: gone not in api_server.devices_of(DRIVER))
    assert len(api_server.devices_of(DRIVER)) == 7


def _instances(gpu: int) -> dict[int, str]:
    """NVML's MIG devices of GPU ``gpu``, read through pynvml: placement start -> UUID."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    out = {}
    for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except pynvml.NVMLError_NotFound:
            continue
        gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, pynvml.nvmlDeviceGetGpuInstanceId(mig))
        start = pynvml.nvmlGpuInstanceGetInfo(gi).placement.start
        out[int(start)] = pynvml.nvmlDeviceGetUUID(mig)
    return out


def _env(dra, cdi_id: str) -> list[str]:
    for path in dra.cdi_dir.glob("hetero-dp-dra_*.json"):
        spec = assert_valid_cdi_spec(path)
        for d in spec["devices"]:
            if f"{spec['kind']}={d['name']}" == cdi_id:
                return d["containerEdits"]["env"]
    raise AssertionError(f"no CDI device {cdi_id}")


async def test_dynamic_mig_publishes_placements_and_makes_instances_on_prepare(
    dra, kubelet, fake_node
):
    from hetero_dp.testing.dra import FakeAPIServer

    node = fake_node("a100-dynamic-mig.scn")
    gpu0, gpu1 = node.uuid(0), node.uuid(1)
    with FakeAPIServer(features=("DRAPartitionableDevices",)) as server:
        dra.api = server
        await dra.start(
            NvidiaBackend(environ={}), options={"nvidia": {**node.options, "dynamicMig": True}}
        )
        await kubelet.wait_registered(DRIVER)
        slices = server.slices_of(DRIVER)
        for s in slices:
            assert kubernetes_validate.validate(s, "1.34", strict=True)
        [counters] = [
            s["spec"]["sharedCounters"] for s in slices if s["spec"].get("sharedCounters")
        ]
        slice_names = [f"memory-slice-{i}" for i in range(8)]
        assert counters == [
            {"name": device_name(gpu0), "counters": {n: {"value": "1"} for n in slice_names}}
        ]
        devices = server.devices_of(DRIVER)
        whole = devices[device_name(gpu0)]
        assert set(whole["consumesCounters"][0]["counters"]) == set(slice_names)
        assert "consumesCounters" not in devices[device_name(gpu1)]  # not in MIG mode
        placements = {k: d for k, d in devices.items() if "migProfile" in d["attributes"]}
        profiles = sorted(d["attributes"]["migProfile"]["string"] for d in placements.values())
        # nvidia-smi mig -lgipp on an A100-40GB, less 7g.40gb (the whole GPU) and 1g.5gb+me
        assert profiles == sorted(
            ["1g.5gb"] * 7 + ["1g.10gb"] * 4 + ["2g.10gb"] * 3 + ["3g.20gb"] * 2 + ["4g.20gb"]
        )
        three = devices[device_name(f"{gpu0}-mig-9-4")]  # 3g.20gb on memory slices 4-7
        assert three["consumesCounters"] == [
            {
                "counterSet": device_name(gpu0),
                "counters": {f"memory-slice-{i}": {"value": "1"} for i in range(4, 8)},
            }
        ]
        assert _instances(0) == {}  # nothing is made until a claim is prepared

        ref = ClaimRef.of(
            server.add_claim(
                make_claim("mig", [("mig", three["name"])], driver=DRIVER, pool="node-a")
            )
        )
        entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
        assert entry.error == ""
        made = _instances(0)
        assert list(made) == [4]
        assert f"NVIDIA_VISIBLE_DEVICES={made[4]}" in _env(dra, entry.devices[0].cdi_device_ids[0])

        # an instance made by hand on slice 0 is in the way of a 2g.10gb on slices 0-1
        import pynvml

        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        spot = pynvml.c_nvmlGpuInstancePlacement_t()
        spot.start, spot.size = 0, 1
        by_hand = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, ctypes.byref(spot))
        two = device_name(f"{gpu0}-mig-14-0")
        blocked = ClaimRef.of(
            server.add_claim(make_claim("two", [("mig", two)], driver=DRIVER, pool="node-a"))
        )
        err = (await kubelet.node_prepare(DRIVER, [blocked])).claims[blocked.uid].error
        assert "taken by an instance this driver did not make" in err
        assert sorted(_instances(0)) == [4]  # nothing half-made is left
        pynvml.nvmlGpuInstanceDestroy(by_hand)

        # a restart: the next process unprepares from the checkpoint and destroys it
        await dra.stop_all()
        await dra.start(
            NvidiaBackend(environ={}), options={"nvidia": {**node.options, "dynamicMig": True}}
        )
        await kubelet.wait_registered(DRIVER)
        result = (await kubelet.node_unprepare(DRIVER, [ref])).claims[ref.uid]
        assert result.error == ""
        assert _instances(0) == {}

        # the whole GPU of a GPU in MIG mode is its full-size instance
        full = ClaimRef.of(
            server.add_claim(
                make_claim("full", [("gpu", device_name(gpu0))], driver=DRIVER, pool="node-a")
            )
        )
        entry = (await kubelet.node_prepare(DRIVER, [full])).claims[full.uid]
        assert entry.error == ""
        [(start, uuid)] = _instances(0).items()
        assert start == 0 and uuid.startswith("MIG-")
        assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in _env(dra, entry.devices[0].cdi_device_ids[0])
        assert (await kubelet.node_unprepare(DRIVER, [full])).claims[full.uid].error == ""
        assert _instances(0) == {}
        await dra.stop_all()


async def test_a_prepare_stuck_in_the_driver_is_not_raced_by_the_kubelets_retry(
    dra, kubelet, fake_node
):
    """A MIG creation that never returns on its own (docs/sources.md#hung-calls): the
    prepare is given up on after hookTimeout, the kubelet's retries are refused while
    the call is stuck (never a second creation beside it), and once the driver call
    returns the retry takes over the instance it made: one instance, destroyed on
    unprepare."""
    from hetero_dp.testing.dra import FakeAPIServer

    node = fake_node(
        "a100-dynamic-mig.scn",
        "fault fn=nvmlDeviceCreateGpuInstanceWithPlacement hang=1 times=1",
    )
    with FakeAPIServer(features=("DRAPartitionableDevices",)) as server:
        dra.api = server
        await dra.start(
            NvidiaBackend(environ={}),
            config={"hookTimeout": 1},
            options={"nvidia": {**node.options, "dynamicMig": True}},
        )
        await kubelet.wait_registered(DRIVER)
        place = device_name(f"{node.uuid(0)}-mig-14-2")  # 2g.10gb on slices 2-3
        ref = ClaimRef.of(
            server.add_claim(make_claim("slow", [("mig", place)], driver=DRIVER, pool="node-a"))
        )
        first = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid].error
        assert "timed out after 1s" in first
        assert await asyncio.to_thread(node.lib.fake_nvml_wait_hanging, 1, 5000)
        again = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid].error
        assert "stuck" in again and "not called again until it returns" in again
        assert _instances(0) == {}

        node.lib.fake_nvml_release_hangs()
        # the kubelet retries a failed prepare on its own schedule; here every 0.1 s
        entry = None
        for _ in range(100):
            entry = (await kubelet.node_prepare(DRIVER, [ref])).claims[ref.uid]
            if not entry.error:
                break
            assert "stuck" in entry.error, entry.error
            await asyncio.sleep(0.1)
        assert entry is not None and entry.error == ""
        made = _instances(0)
        assert list(made) == [2]
        assert f"NVIDIA_VISIBLE_DEVICES={made[2]}" in _env(dra, entry.devices[0].cdi_device_ids[0])
        assert (await kubelet.node_unprepare(DRIVER, [ref])).claims[ref.uid].error == ""
        assert _instances(0) == {}
        await dra.stop_all()
