"""docs/dra.md: its example objects validate for Kubernetes 1.34 and later, and its
CEL selectors name attributes and capacities that slices of such devices carry."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from hetero_dp.dra.slices import render_devices
from hetero_dp.model.device import Device

DOC = Path(__file__).resolve().parents[2] / "docs" / "dra.md"


def examples() -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    return [d for b in blocks for d in yaml.safe_load_all(b) if d]


def test_docs_have_the_promised_examples():
    kinds = [d["kind"] for d in examples()]
    assert kinds.count("DeviceClass") >= 2 and kinds.count("ResourceClaimTemplate") >= 2


def test_the_daemonset_example_rolls_with_surge_and_a_readiness_probe():
    """Surge with a probe of the new pod's own readiness: without one, the new pod
    counts as ready the moment it starts and the old one is stopped at once."""
    [ds] = [d for d in examples() if d["kind"] == "DaemonSet"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    [c] = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom") or e.get("value") for e in c["env"]}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert env["HETERO_DP_METRICS_ADDRESS"] == f":{ports['metrics']}"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


@pytest.mark.parametrize("k8s", ["1.34", "1.35", "1.36", "1.37"])
def test_doc_examples_validate(k8s):
    for obj in examples():
        assert kubernetes_validate.validate(obj, k8s, strict=True), obj["metadata"]["name"]


# Records shaped like the NVIDIA and udev backends' (attribute names as they publish them).
NVIDIA_GPU = Device(
    id="GPU-8a1f0c2e-1111-2222-3333-444455556666",
    resource="nvidia.com/gpu",
    index=0,
    numa_nodes=(0,),
    attributes={
        "productName": "NVIDIA A100-SXM4-80GB",
        "architecture": "Ampere",
        "cudaComputeCapability": "8.0",
        "pcieBusID": "00000000:07:00.0",
        "driverVersion": "550.54.15",
        "cudaDriverVersion": "12.4",
        "uuid": "GPU-8a1f0c2e-1111-2222-3333-444455556666",
        "memoryMiB": 81920,
        "migEnabled": False,
    },
)
NVIDIA_MIG = Device(
    id="MIG-0a1b2c3d-1111-2222-3333-444455556666",
    resource="nvidia.com/mig-1g.5gb",
    parent=NVIDIA_GPU.id,
    attributes={"migProfile": "1g.5gb", "memoryMiB": 4864, "gpuInstance": 7, "computeInstance": 0},
)
AMD_GPU = Device(
    id="0000:03:00.0",
    resource="amd.com/gpu",
    numa_nodes=(1,),
    attributes={
        "sysname": "0000:03:00.0",
        "subsystem": "pci",
        "product": "Instinct MI210",
        "pci": "0000:03:00.0",
        "vendor": "0x1002",
        "device": "0x740f",
        "driver": "amdgpu",
    },
)


def referenced(expression: str) -> set[tuple[str, str]]:
    """(attributes|capacity, name) pairs a selector reads."""
    return set(re.findall(r"device\.(attributes|capacity)\[[^\]]+\]\.(\w+)", expression)) | {
        ("attributes", n) for n in re.findall(r'"(\w+)" in device\.attributes', expression)
    }


def test_doc_selectors_read_what_the_slices_carry():
    published = {}
    for d in (NVIDIA_GPU, NVIDIA_MIG, AMD_GPU):
        [rendered] = render_devices([d])
        published[d.resource] = rendered
    classes = {o["metadata"]["name"]: o for o in examples() if o["kind"] == "DeviceClass"}
    for name, resource in (
        ("large-gpu.example.com", "nvidia.com/gpu"),
        ("mig-small.example.com", "nvidia.com/mig-1g.5gb"),
        ("amd-gpu.example.com", "amd.com/gpu"),
    ):
        expression = classes[name]["spec"]["selectors"][0]["cel"]["expression"]
        device = published[resource]
        for field, key in referenced(expression):
            assert key in device.get(field, {}), f"{name} reads {field}.{key}: {device}"
    gpu = published["nvidia.com/gpu"]
    assert gpu["attributes"]["cudaComputeCapability"] == {"version": "8.0.0"}
    assert gpu["capacity"]["memory"] == {"value": "80Gi"}  # canonical, as the server stores it
    templates = [o for o in examples() if o["kind"] == "ResourceClaimTemplate"]
    match = [
        c["matchAttribute"]
        for t in templates
        for c in t["spec"]["spec"]["devices"].get("constraints", [])
    ]
    assert match == ["gpu.amd.com/numaNode"]
    assert "numaNode" in published["amd.com/gpu"]["attributes"]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_stand_in_claims_have_the_real_shape(version):
    from hetero_dp.testing.dra import make_claim

    claim = make_claim(
        "c", [("npu", "d0"), ("npu", "d1")], driver="npu.a.example.com", pool="n", version=version
    )
    assert kubernetes_validate.validate(claim, "1.34", strict=True)
