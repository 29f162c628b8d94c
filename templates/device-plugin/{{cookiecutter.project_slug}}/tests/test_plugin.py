"""The plugin against hetero-dp's fake kubelet: real gRPC over real unix sockets.

The fixtures `fake_kubelet` and `plugin_runner` come with hetero-dp (a pytest plugin).
Device nodes are plain files in a temp dir, so no hardware is needed.
"""

import os

from {{ cookiecutter.package_name }} import RESOURCE, Plugin


async def start(plugin_runner, tmp_path, count):
    for i in range(count):
        (tmp_path / f"dev{i}").touch()
    options = {"{{ cookiecutter.package_name }}": {"deviceGlob": str(tmp_path / "dev*")}}
    return await plugin_runner.start(Plugin(), options=options)


async def test_registers_and_lists_every_node(fake_kubelet, plugin_runner, tmp_path):
    await start(plugin_runner, tmp_path, 3)
    devices = await fake_kubelet.wait_devices(RESOURCE, lambda d: len(d) == 3)
    assert sorted(devices) == ["dev0", "dev1", "dev2"]
    assert all(d.healthy for d in devices.values())


async def test_vanished_node_turns_unhealthy(fake_kubelet, plugin_runner, tmp_path):
    daemon = await start(plugin_runner, tmp_path, 2)
    await fake_kubelet.wait_devices(RESOURCE, lambda d: len(d) == 2)
    os.remove(tmp_path / "dev1")
    await daemon.poll_health()
    devices = await fake_kubelet.wait_devices(RESOURCE, lambda d: not d["dev1"].healthy)
    assert devices["dev0"].healthy
    assert fake_kubelet.resources[RESOURCE].allocatable == 1


async def test_allocate_gives_the_node_and_env(fake_kubelet, plugin_runner, tmp_path):
    await start(plugin_runner, tmp_path, 2)
    await fake_kubelet.wait_devices(RESOURCE, lambda d: len(d) == 2)
    response = await fake_kubelet.allocate(RESOURCE, ["dev1"])
    assert [d.host_path for d in response.devices] == [str(tmp_path / "dev1")]
    assert response.envs["{{ cookiecutter.env_var }}"] == "dev1"


async def test_host_root_maps_paths_back_to_the_host(fake_kubelet, plugin_runner, tmp_path):
    # In the DaemonSet the host's /dev is seen at /host/dev: option hostRoot=/host.
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "acme0").touch()
    options = {"{{ cookiecutter.package_name }}": {"deviceGlob": "/dev/acme*", "hostRoot": str(tmp_path)}}
    await plugin_runner.start(Plugin(), options=options)
    devices = await fake_kubelet.wait_devices(RESOURCE, lambda d: len(d) == 1)
    assert devices["acme0"].healthy
    response = await fake_kubelet.allocate(RESOURCE, ["acme0"])
    assert [d.host_path for d in response.devices] == ["/dev/acme0"]
