"""What a container gets, per device ID strategy and device list strategy.

Checked against NVIDIA's conventions (docs/sources.md#nvidia-conventions:
k8s-device-plugin's internal/plugin/server.go). The default
response is built from the records the way the framework documents it (env
values joined with commas in first-seen order, nodes and mounts de-duplicated
by container path); ``build_response`` below is that rule, written small.
"""

from __future__ import annotations

from hetero_dp_nvidia.backend import NvidiaBackend

from hetero_dp import ContainerResponse, Device


def build_response(devices: list[Device]) -> ContainerResponse:
    resp = ContainerResponse()
    for d in devices:
        for key, value in d.env.items():
            seen = resp.envs[key].split(",") if key in resp.envs else []
            if value not in seen:
                resp.envs[key] = ",".join([*seen, value])
        for m in d.mounts:
            resp.add_mount(m)
        for n in d.nodes:
            resp.add_device_node(n)
    return resp


def allocate(node, ids, env, **flags):
    b = NvidiaBackend(environ=env)
    b.configure({**node.options, **flags})
    devices = {d.id: d for d in b.discover()}
    b.shutdown()
    return build_response([devices[i] for i in ids])


def specs(resp):
    return {(n.container_path, n.host_path, n.permissions) for n in resp.devices}


def test_envvar_uuid_default(fake_node):
    node = fake_node("h100-8x.scn")
    resp = allocate(node, [node.uuid(1), node.uuid(2)], {})
    assert resp.envs == {"NVIDIA_VISIBLE_DEVICES": f"{node.uuid(1)},{node.uuid(2)}"}
    assert resp.mounts == [] and resp.devices == [] and resp.annotations == {}


def test_envvar_index(fake_node):
    node = fake_node("h100-8x.scn")
    resp = allocate(node, [node.uuid(3), node.uuid(7)], {"DEVICE_ID_STRATEGY": "index"})
    assert resp.envs == {"NVIDIA_VISIBLE_DEVICES": "3,7"}


def test_mig_index_is_gpu_colon_mig(fake_node):
    node = fake_node("a100-mig-mixed.scn")
    resp = allocate(
        node, node.mig_uuids(1), {"DEVICE_ID_STRATEGY": "index", "MIG_STRATEGY": "mixed"}
    )
    assert resp.envs == {"NVIDIA_VISIBLE_DEVICES": "1:0,1:1"}


def test_mig_uuid(fake_node):
    node = fake_node("a100-mig-mixed.scn")
    migs = node.mig_uuids(2)
    resp = allocate(node, migs[:1], {"MIG_STRATEGY": "mixed"})
    assert resp.envs == {"NVIDIA_VISIBLE_DEVICES": migs[0]}
    assert migs[0].startswith("MIG-")


def test_volume_mounts(fake_node):
    node = fake_node("h100-8x.scn")
    resp = allocate(node, [node.uuid(0), node.uuid(4)], {"DEVICE_LIST_STRATEGY": "volume-mounts"})
    assert resp.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert [(m.host_path, m.container_path) for m in resp.mounts] == [
        ("/dev/null", f"/var/run/nvidia-container-devices/{node.uuid(0)}"),
        ("/dev/null", f"/var/run/nvidia-container-devices/{node.uuid(4)}"),
    ]
    assert resp.devices == []


def test_volume_mounts_index(fake_node):
    node = fake_node("h100-8x.scn")
    resp = allocate(
        node,
        [node.uuid(2)],
        {"DEVICE_LIST_STRATEGY": "volume-mounts", "DEVICE_ID_STRATEGY": "index"},
    )
    assert [m.container_path for m in resp.mounts] == ["/var/run/nvidia-container-devices/2"]


def test_pass_device_specs_control_nodes_only_where_present(fake_node):
    node = fake_node("h100-8x.scn")  # nvidiactl, nvidia-uvm, nvidia-uvm-tools; no modeset
    dev = node.root / "driver"
    resp = allocate(node, [node.uuid(1), node.uuid(6)], {"PASS_DEVICE_SPECS": "true"})
    assert specs(resp) == {
        ("/dev/nvidiactl", f"{dev}/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", f"{dev}/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia-uvm-tools", f"{dev}/dev/nvidia-uvm-tools", "rw"),
        ("/dev/nvidia1", f"{dev}/dev/nvidia1", "rw"),
        ("/dev/nvidia6", f"{dev}/dev/nvidia6", "rw"),
    }
    assert resp.envs == {"NVIDIA_VISIBLE_DEVICES": f"{node.uuid(1)},{node.uuid(6)}"}


def test_pass_device_specs_with_modeset_present(fake_node):
    node = fake_node("h100-8x.scn", control_nodes=("nvidiactl", "nvidia-modeset"))
    resp = allocate(node, [node.uuid(0)], {"PASS_DEVICE_SPECS": "true"})
    assert {n.container_path for n in resp.devices} == {
        "/dev/nvidiactl",
        "/dev/nvidia-modeset",
        "/dev/nvidia0",
    }


def test_pass_device_specs_mig_adds_caps_nodes(fake_node):
    node = fake_node("a100-mig-mixed.scn")
    mig = next(m for m in node.migs if m["gpu"] == "1")
    resp = allocate(node, [mig["uuid"]], {"PASS_DEVICE_SPECS": "true", "MIG_STRATEGY": "mixed"})
    assert {n.container_path for n in resp.devices} == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia1",
        f"/dev/nvidia-caps/nvidia-cap{mig['gicap']}",
        f"/dev/nvidia-caps/nvidia-cap{mig['cicap']}",
    }


def test_control_nodes_are_marked_shared(fake_node):
    node = fake_node("h100-8x.scn")
    b = NvidiaBackend(environ={"PASS_DEVICE_SPECS": "true"})
    b.configure(node.options)
    d = b.discover()[0]
    b.shutdown()
    assert {n.container_path: n.shared for n in d.nodes} == {
        "/dev/nvidiactl": True,
        "/dev/nvidia-uvm": True,
        "/dev/nvidia-uvm-tools": True,
        "/dev/nvidia0": False,
    }


def test_default_driver_root_gives_plain_host_paths(fake_node, tmp_path):
    node = fake_node("h100-8x.scn")
    opts = {k: v for k, v in node.options.items() if k != "nvidiaDriverRoot"}
    b = NvidiaBackend(
        environ={"PASS_DEVICE_SPECS": "true", "CONTAINER_DRIVER_ROOT": str(node.root / "driver")}
    )
    b.configure(opts)
    d = b.discover()[2]
    b.shutdown()
    assert {(n.container_path, n.host_path) for n in d.nodes} >= {
        ("/dev/nvidiactl", "/dev/nvidiactl"),
        ("/dev/nvidia2", "/dev/nvidia2"),
    }


def test_cdi_only_has_no_env_or_mounts_but_keeps_nodes_for_the_spec(fake_node):
    node = fake_node("h100-8x.scn")
    resp = allocate(node, [node.uuid(0)], {"DEVICE_LIST_STRATEGY": "cdi-cri"})
    assert resp.envs == {} and resp.mounts == []
    assert "/dev/nvidia0" in {n.container_path for n in resp.devices}


def test_resource_defaults_map_list_strategies(fake_node):
    node = fake_node("h100-8x.scn")
    cases = {
        "envvar": ["device-specs"],
        "volume-mounts": ["device-specs"],
        "cdi-annotations": ["cdi-annotations"],
        "cdi-cri": ["cdi-cri"],
        "envvar,cdi-annotations": ["device-specs", "cdi-annotations"],
    }
    for strategy, deliver in cases.items():
        b = NvidiaBackend(
            environ={
                "DEVICE_LIST_STRATEGY": strategy,
                "CDI_ANNOTATION_PREFIX": "nvidia.cdi.k8s.io/",
            }
        )
        b.configure(node.options)
        got = b.resource_defaults("nvidia.com/gpu")
        assert got == {
            "deliver": deliver,
            "cdiKind": "k8s.device-plugin.nvidia.com/gpu",
            "cdiAnnotationPrefix": "nvidia.cdi.k8s.io/",
            "replicaPolicy": "distributed",  # NVIDIA's sharedDevicesAllocationPolicy default
        }, strategy
        assert b.resource_defaults("nvidia.com/mig-1g.5gb") == got
        assert b.resource_defaults("amd.com/gpu") is None
        b.shutdown()
