"""The NVIDIA backend, unchanged, served as a DRA driver: NVML answered by the fake
libnvidia-ml through real pynvml, slices checked against the 1.34 schema, a claim
prepared into a CDI spec, and an XID 79 withdrawing the GPU from the pool.

Run by test_nvidia_dra.py in a pytest of its own: the fake libnvidia-ml is loaded
once per process, and tests/nvidia loads its own copy in the main run.
"""

from __future__ import annotations

import asyncio

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
