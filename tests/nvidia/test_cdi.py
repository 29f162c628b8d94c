"""NVIDIA's CDI list strategies through the framework's CDI delivery: the backend's
``resource_defaults`` give each resource its settings; specs are written by the
framework's CDIPublisher and checked as a runtime would read them."""

from __future__ import annotations

import json
from pathlib import Path

from hetero_dp_nvidia.backend import NvidiaBackend

from tests.cdi.schema_check import assert_valid_cdi_spec

KIND = "k8s.device-plugin.nvidia.com/gpu"


async def start(plugin_runner, node, env, cdi_dir: Path) -> NvidiaBackend:
    """Serve with CDI on; each resource's settings come from the backend's
    resource_defaults (no ``resources`` section in the config)."""
    backend = NvidiaBackend(environ=env)
    await plugin_runner.start(
        backend,
        config={"cdi": {"enabled": True, "dir": str(cdi_dir)}},
        options={"nvidia": node.options},
    )
    return backend


def spec(cdi_dir: Path) -> dict:
    [path] = cdi_dir.glob("*.json")
    return assert_valid_cdi_spec(json.loads(path.read_text()))


async def test_cdi_cri_mixed_mig(fake_kubelet, plugin_runner, fake_node, tmp_path):
    node = fake_node("a100-8x-nvlink.scn")
    cdi_dir = tmp_path / "cdi"
    await start(
        plugin_runner, node, {"DEVICE_LIST_STRATEGY": "cdi-cri", "MIG_STRATEGY": "mixed"}, cdi_dir
    )
    await fake_kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 7)
    mig = node.mig_uuids(0)[2]
    await fake_kubelet.wait_devices("nvidia.com/mig-2g.10gb", lambda d: list(d) == [mig])

    r = await fake_kubelet.allocate("nvidia.com/gpu", [node.uuid(3)])
    assert [c.name for c in r.cdi_devices] == [f"{KIND}={node.uuid(3)}"]
    assert dict(r.envs) == {} and list(r.devices) == [] and list(r.mounts) == []
    r = await fake_kubelet.allocate("nvidia.com/mig-2g.10gb", [mig])
    assert [c.name for c in r.cdi_devices] == [f"{KIND}={mig}"]

    s = spec(cdi_dir)  # one spec for GPUs and MIG devices alike (one kind)
    assert s["kind"] == KIND
    devices = {d["name"]: d for d in s["devices"]}
    assert set(devices) == {g["uuid"] for g in node.gpus[1:]} | set(node.mig_uuids(0))
    shared = {n["path"] for n in s["containerEdits"]["deviceNodes"]}
    assert shared == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    m = next(x for x in node.migs if x["uuid"] == mig)
    assert {n["path"] for n in devices[mig]["containerEdits"]["deviceNodes"]} == {
        "/dev/nvidia0",
        f"/dev/nvidia-caps/nvidia-cap{m['gicap']}",
        f"/dev/nvidia-caps/nvidia-cap{m['cicap']}",
    }
    dev = node.root / "driver/dev"
    host = {
        n["path"]: n.get("hostPath") for n in devices[node.uuid(3)]["containerEdits"]["deviceNodes"]
    }
    assert host == {"/dev/nvidia3": f"{dev}/nvidia3"}


async def test_cdi_annotations_with_prefix(fake_kubelet, plugin_runner, fake_node, tmp_path):
    node = fake_node("h100-8x.scn")
    env = {"DEVICE_LIST_STRATEGY": "cdi-annotations", "CDI_ANNOTATION_PREFIX": "nvidia.cdi.k8s.io/"}
    await start(plugin_runner, node, env, tmp_path / "cdi")
    await fake_kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    r = await fake_kubelet.allocate("nvidia.com/gpu", [node.uuid(1), node.uuid(2)])
    [(key, value)] = [(k, v) for k, v in r.annotations.items()]
    assert key.startswith("nvidia.cdi.k8s.io/")
    assert value == f"{KIND}={node.uuid(1)},{KIND}={node.uuid(2)}"
    assert dict(r.envs) == {} and list(r.devices) == []


async def test_config_resources_section_wins_over_backend_defaults(
    fake_kubelet, plugin_runner, fake_node, tmp_path
):
    """A ``resources`` section's cdiKind wins over the backend's default kind: CDI names
    only, kind nvidia.com/gpu, and the spec (in the test's own CDI dir, never the
    host's /var/run/cdi) is of that kind."""
    node = fake_node("h100-8x.scn")
    cdi_dir = tmp_path / "cdi"
    await plugin_runner.start(
        NvidiaBackend(environ={"DEVICE_LIST_STRATEGY": "cdi-cri"}),
        config={
            "resources": {"nvidia.com/gpu": {"cdiKind": "nvidia.com/gpu"}},
            "cdi": {"dir": str(cdi_dir)},
        },
        options={"nvidia": node.options},
    )
    await fake_kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    r = await fake_kubelet.allocate("nvidia.com/gpu", [node.uuid(0)])
    assert [c.name for c in r.cdi_devices] == [f"nvidia.com/gpu={node.uuid(0)}"]
    assert list(r.devices) == []
    assert spec(cdi_dir)["kind"] == "nvidia.com/gpu"
