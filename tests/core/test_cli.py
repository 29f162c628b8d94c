"""The daemon as a process: SIGTERM cleanup, the example plugin end to end, list, demo."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from hetero_dp.testing import FakeKubelet

EXAMPLE = "docs/examples/acme.py"


async def spawn(cmd: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *cmd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def test_sigterm_stops_streams_removes_sockets_exits_0(fake_kubelet, cli_env, hetero_dp_cmd):
    proc = await spawn(
        [*hetero_dp_cmd, "run", "simulated", "--kubelet-dir", str(fake_kubelet.plugin_dir)],
        cli_env,
    )
    try:
        res = await fake_kubelet.wait_registered("hetero-dp.io/sim", timeout=30)
        sockets = {p.name for p in fake_kubelet.plugin_dir.iterdir()}
        assert len(sockets) == 2  # kubelet.sock and the plugin's own
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
    stderr = (await proc.stderr.read()).decode()
    assert code == 0, stderr
    assert [p.name for p in fake_kubelet.plugin_dir.iterdir()] == ["kubelet.sock"]
    await fake_kubelet.wait_for(lambda: res.stream_ended)


async def test_example_plugin_end_to_end(fake_kubelet, cli_env, hetero_dp_cmd, tmp_path, repo_root):
    # `hetero-dp run` takes only device nodes (the container gate): each fake node is
    # a link to /dev/null, a character device, in a dev dir as a driver root's are
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(3):
        os.symlink("/dev/null", dev / f"acme{i}")
    env = dict(cli_env, ACME_DEV_GLOB=str(dev / "acme*"))
    cmd = [
        *hetero_dp_cmd,
        "run",
        str(repo_root / EXAMPLE),
        "--kubelet-dir",
        str(fake_kubelet.plugin_dir),
        "--health-interval",
        "0.05",
    ]
    proc = await spawn(cmd, env)
    name = "acme.example.com/npu"
    try:
        await fake_kubelet.wait_devices(name, lambda d: len(d) == 3, timeout=30)
        resp = await fake_kubelet.allocate(name, ["npu0", "npu2"])
        assert resp.envs["ACME_VISIBLE_DEVICES"] == "0,2"
        assert [(d.host_path, d.container_path) for d in resp.devices] == [
            (str(dev / "acme0"), "/dev/acme0"),
            (str(dev / "acme2"), "/dev/acme2"),
        ]
        (dev / "acme1").unlink()  # the health check notices the node vanished
        await fake_kubelet.wait_devices(name, lambda d: not d["npu1"].healthy, timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0


def test_example_plugin_is_at_most_40_lines(repo_root):
    """The tutorial's promise, typed options included."""
    lines = (repo_root / EXAMPLE).read_text().splitlines()
    assert len(lines) <= 40


def test_list_prints_what_a_backend_discovers(cli_env, hetero_dp_cmd):
    out = subprocess.run(
        [*hetero_dp_cmd, "list", "simulated", "-o", "simulated.count=3", "--json"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
        check=True,
    ).stdout
    devices = json.loads(out)
    assert [d["id"] for d in devices] == ["sim0", "sim1", "sim2"]
    # sim0 and sim1 share a board, which sits inside one NUMA node; sim2 is on the next
    assert [d["numaNodes"] for d in devices] == [[0], [0], [1]]
    assert devices[1]["env"] == {"SIM_VISIBLE_DEVICES": "1"}
    table = subprocess.run(
        [*hetero_dp_cmd, "list", "simulated"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
        check=True,
    ).stdout
    assert table.splitlines()[0].split() == ["ID", "RESOURCE", "HEALTH", "NUMA", "NODES"]
    assert "sim3" in table


def test_demo_runs_and_exits_0(cli_env, hetero_dp_cmd):
    proc = subprocess.run(
        [*hetero_dp_cmd, "demo"], capture_output=True, text=True, env=cli_env, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "health flip: sim1 reported unhealthy -> allocatable 3/4" in proc.stdout
    assert "recovery: sim1 healthy again -> allocatable 4/4" in proc.stdout
    assert "SIM_VISIBLE_DEVICES" in proc.stdout


async def test_fake_kubelet_rejects_bad_registrations(tmp_path):
    """The fake kubelet validates as the real one does (version, name, dial-back)."""
    from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
    from hetero_dp.deviceplugin.registration import register_once
    from hetero_dp.testing import short_tempdir

    root = short_tempdir()
    try:
        async with FakeKubelet(root) as kubelet:
            import grpc

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await register_once(kubelet.socket_path, "x.sock", "bad", pb.DevicePluginOptions())
            assert "no vendor prefix" in err.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await register_once(
                    kubelet.socket_path, "nobody.sock", "a.com/b", pb.DevicePluginOptions()
                )
            assert "dial-back" in err.value.details()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert len(kubelet.rejections) == 2


def test_generated_protobuf_code_matches_proto(repo_root):
    pytest.importorskip("grpc_tools")
    proc = subprocess.run(
        [sys.executable, "scripts/gen_proto.py", "--check"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_wire_names_and_field_numbers():
    from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb

    svc = pb.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert svc.full_name == "v1beta1.DevicePlugin"
    assert [m.name for m in svc.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    car = pb.ContainerAllocateResponse.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in car.items()} == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    req = pb.ContainerPreferredAllocationRequest.DESCRIPTOR.fields_by_name
    assert req["available_deviceIDs"].number == 1 and req["allocation_size"].number == 3
    assert pb.ContainerAllocateRequest.DESCRIPTOR.fields_by_name["devices_ids"].number == 1
    assert os.path.basename(pb.__file__) == "deviceplugin_v1beta1_pb2.py"


def test_topo_shows_matrix_and_choice(cli_env, hetero_dp_cmd):
    proc = subprocess.run(
        [*hetero_dp_cmd, "topo", "simulated", "--size", "2", "--must", "sim1"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "PIX" in out and "SYS" in out  # the simulated backend's link kinds
    assert "sim1" in out and "sim0" in out  # sim0 shares a board with sim1: the best pair
    bad = subprocess.run(
        [*hetero_dp_cmd, "topo", "simulated", "--size", "9"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert bad.returncode == 1 and "9" in bad.stderr


PICKY = """
from hetero_dp import hookimpl
from hetero_dp.model.errors import ConfigError


@hookimpl
def configure(options):
    raise ConfigError("must be a positive number", field="count")


@hookimpl
def discover():
    return []
"""


async def test_list_and_run_name_a_refused_option_alike(tmp_path, plugin_runner):
    """``list`` (and ``topology``) report a backend's refusal with its field, as ``run`` does."""
    from hetero_dp.cli.inspect import discover_once
    from hetero_dp.engine.config import load_config
    from hetero_dp.model.errors import ConfigError

    plugin = tmp_path / "picky.py"
    plugin.write_text(PICKY)
    with pytest.raises(ConfigError) as listed:
        await discover_once(str(plugin), load_config(raw={}, env={}))
    with pytest.raises(ConfigError) as ran:
        await plugin_runner.start(str(plugin))
    # named where the user writes it: the config and the field under backends.<name>
    assert (listed.value.source, listed.value.field) == ("inline config", "backends.picky.count")
    assert str(listed.value) == str(ran.value)
