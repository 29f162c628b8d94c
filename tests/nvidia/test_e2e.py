"""End to end through the framework: the backend served to the fake kubelet over real
unix sockets, NVML answered by the fake driver through real pynvml."""

from __future__ import annotations

import pytest
from hetero_dp_nvidia.backend import NvidiaBackend

from hetero_dp import ConfigError

GPU = "nvidia.com/gpu"


async def serve(plugin_runner, node, env=None, config=None, **flags):
    backend = NvidiaBackend(environ=env or {})
    daemon = await plugin_runner.start(
        backend, config=config, options={"nvidia": {**node.options, **flags}}
    )
    backend.monitor.wait_ms = 200  # bounds only how fast the watch thread sees shutdown
    return backend, daemon


async def wait_watching(backend, lib):
    import asyncio

    assert await asyncio.to_thread(backend.monitor.ready.wait, 10)
    assert await asyncio.to_thread(lib.fake_nvml_wait_waiters, 1, 5000)


async def test_kubelet_sees_gpus_with_numa_and_allocates_envvar(
    fake_kubelet, plugin_runner, fake_node
):
    node = fake_node("h100-8x.scn")
    await serve(plugin_runner, node)
    devices = await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 8)
    assert list(devices) == [g["uuid"] for g in node.gpus]
    assert [d.numa_nodes for d in devices.values()] == [(0,)] * 4 + [(1,)] * 4
    assert all(d.healthy for d in devices.values())
    resp = await fake_kubelet.allocate(GPU, [node.uuid(2), node.uuid(5)])
    assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{node.uuid(2)},{node.uuid(5)}"}
    assert list(resp.devices) == [] and list(resp.mounts) == []


async def test_allocate_volume_mounts_index_with_device_specs(
    fake_kubelet, plugin_runner, fake_node
):
    node = fake_node("h100-8x.scn")
    env = {
        "DEVICE_LIST_STRATEGY": "volume-mounts",
        "DEVICE_ID_STRATEGY": "index",
        "PASS_DEVICE_SPECS": "true",
    }
    await serve(plugin_runner, node, env)
    await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 8)
    resp = await fake_kubelet.allocate(GPU, [node.uuid(3)])
    assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert [(m.host_path, m.container_path) for m in resp.mounts] == [
        ("/dev/null", "/var/run/nvidia-container-devices/3")
    ]
    dev = node.root / "driver/dev"
    assert {(s.container_path, s.host_path, s.permissions) for s in resp.devices} == {
        ("/dev/nvidiactl", f"{dev}/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", f"{dev}/nvidia-uvm", "rw"),
        ("/dev/nvidia-uvm-tools", f"{dev}/nvidia-uvm-tools", "rw"),
        ("/dev/nvidia3", f"{dev}/nvidia3", "rw"),
    }


async def test_xid79_reaches_the_kubelet_for_gpu_and_every_mig_slice_then_recovers(
    fake_kubelet, plugin_runner, fake_node
):
    node = fake_node("a100-8x-nvlink.scn")
    backend, _ = await serve(
        plugin_runner, node, {"MIG_STRATEGY": "mixed"}, recoveryQuietPeriod=0.3
    )
    migs = node.mig_uuids(0)
    profiles = {
        "nvidia.com/mig-1g.5gb": migs[:2],
        "nvidia.com/mig-2g.10gb": [migs[2]],
        "nvidia.com/mig-3g.20gb": [migs[3]],
    }
    for res, ids in profiles.items():
        await fake_kubelet.wait_devices(res, lambda d, ids=ids: list(d) == ids)
    await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 7)
    await wait_watching(backend, node.lib)

    node.lib.fake_nvml_inject_xid(0, 13)  # application error: ignored
    node.lib.fake_nvml_inject_xid(1, 79)  # whole GPU 1
    node.lib.fake_nvml_inject_xid(0, 79)  # GPU 0: every MIG slice of it
    await fake_kubelet.wait_devices(GPU, lambda d: not d[node.uuid(1)].healthy)
    for res, ids in profiles.items():
        devices = await fake_kubelet.wait_devices(
            res, lambda d, ids=ids: all(not d[i].healthy for i in ids)
        )
    gpus = fake_kubelet.resources[GPU].devices
    assert [u for u, d in gpus.items() if not d.healthy] == [node.uuid(1)]

    # recovery: quiet period over, probe passes, everything Healthy again
    for res, ids in profiles.items():
        devices = await fake_kubelet.wait_devices(
            res, lambda d, ids=ids: all(d[i].healthy for i in ids)
        )
        assert all(devices[i].healthy for i in ids)
    await fake_kubelet.wait_devices(GPU, lambda d: all(x.healthy for x in d.values()))


async def test_allocating_an_unhealthy_gpu_is_refused(fake_kubelet, plugin_runner, fake_node):
    import grpc

    node = fake_node("h100-8x.scn")
    backend, _ = await serve(plugin_runner, node, recoveryQuietPeriod=0)
    await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 8)
    await wait_watching(backend, node.lib)
    node.lib.fake_nvml_inject_event(4, 0x2, 0, 0xFFFFFFFF, 0xFFFFFFFF)  # double-bit ECC
    await fake_kubelet.wait_devices(GPU, lambda d: not d[node.uuid(4)].healthy)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await fake_kubelet.allocate(GPU, [node.uuid(4)])
    assert "double-bit ECC" in info.value.details()


async def test_links_reach_the_resource_for_preferred_allocation(
    fake_kubelet, plugin_runner, fake_node
):
    node = fake_node("a100-8x-nvlink.scn")
    _, daemon = await serve(plugin_runner, node)
    await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 8)
    table = daemon.resources[GPU].links
    assert table[(node.uuid(0), node.uuid(1))] == 450
    assert table[(node.uuid(1), node.uuid(0))] == 450
    assert table[(node.uuid(3), node.uuid(4))] == 10
    ids = [g["uuid"] for g in node.gpus]
    chosen = await fake_kubelet.preferred_allocation(GPU, ids, [node.uuid(0)], 2)
    assert len(chosen) == 2 and chosen[0] == node.uuid(0)


async def test_fail_on_init_error_false_serves_nothing_but_stays_up(
    fake_kubelet, plugin_runner, fake_node
):
    node = fake_node("h100-8x.scn", "init_error 18")
    _, daemon = await serve(plugin_runner, node, failOnInitError=False)
    assert daemon.ready.is_set()
    assert fake_kubelet.resources == {}


async def test_version_mismatch_stops_start_up_with_the_fix(plugin_runner, fake_node):
    node = fake_node("h100-8x.scn", "init_error 18")
    with pytest.raises(ConfigError) as info:
        await serve(plugin_runner, node)
    assert "version mismatch" in str(info.value)
    assert "reload the nvidia kernel module or reboot the node" in str(info.value)


async def test_single_strategy_mismatch_stops_start_up(plugin_runner, fake_node):
    node = fake_node("a100-8x-nvlink.scn")
    with pytest.raises(ConfigError, match="migStrategy"):
        await serve(plugin_runner, node, {"MIG_STRATEGY": "single"})


async def test_nvidia_config_file_flags_section(fake_kubelet, plugin_runner, fake_node):
    node = fake_node("a100-mig-single.scn")
    config = {
        "version": "v1",
        "flags": {
            "migStrategy": "single",
            **node.options,
            "plugin": {"deviceIDStrategy": "index", "passDeviceSpecs": False},
        },
    }
    backend = NvidiaBackend(environ={})
    await plugin_runner.start(backend, config=config)
    devices = await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 4)
    resp = await fake_kubelet.allocate(GPU, list(devices)[2:])
    assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": "1:0,1:1"}


async def test_entry_point_instance_with_nvidia_env_vars(
    fake_kubelet, plugin_runner, fake_node, monkeypatch
):
    from hetero_dp.engine.loading import resolve

    _, instance = resolve("nvidia")  # the instance the entry point names

    node = fake_node("a100-mig-mixed.scn")
    monkeypatch.setenv("MIG_STRATEGY", "mixed")
    monkeypatch.setenv("DEVICE_ID_STRATEGY", "index")
    try:
        await plugin_runner.start(instance, options={"nvidia": node.options})
        devices = await fake_kubelet.wait_devices("nvidia.com/mig-3g.40gb", lambda d: len(d) == 2)
        resp = await fake_kubelet.allocate("nvidia.com/mig-3g.40gb", list(devices))
        assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": "1:0,1:1"}
    finally:
        await plugin_runner.stop_all()
        instance.shutdown()


async def test_driver_root_ctr_path_with_pass_device_specs_passes_every_control_node(
    fake_kubelet, plugin_runner, fake_node
):
    # NVIDIA's manifest shape: the host's driver root is "/", mounted into the plugin's
    # container elsewhere (DRIVER_ROOT_CTR_PATH); nodes are found there, passed as "/".
    node = fake_node("h100-8x.scn")
    env = {
        "PASS_DEVICE_SPECS": "true",
        "NVIDIA_DRIVER_ROOT": "/",
        "DRIVER_ROOT_CTR_PATH": str(node.root / "driver"),
    }
    await serve(plugin_runner, node, env)
    await fake_kubelet.wait_devices(GPU, lambda d: len(d) == 8)
    resp = await fake_kubelet.allocate(GPU, [node.uuid(3)])
    assert {(s.container_path, s.host_path) for s in resp.devices} == {
        ("/dev/nvidiactl", "/dev/nvidiactl"),
        ("/dev/nvidia-uvm", "/dev/nvidia-uvm"),
        ("/dev/nvidia-uvm-tools", "/dev/nvidia-uvm-tools"),
        ("/dev/nvidia3", "/dev/nvidia3"),
    }
