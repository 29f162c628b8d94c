"""The container gate: a backend's records and Allocate answers carry no host file,
mount of the host's kernel interfaces or loader variable into a container,
whatever the delivery; the refused device is Unhealthy naming the field, the
others serve (issue #29)."""

from __future__ import annotations

import os

import grpc
import pytest

from hetero_dp import ContainerResponse, Device, DeviceNode, Mount, hookimpl
from hetero_dp.allocation.gate import (
    device_problems,
    env_problem,
    gate_device,
    mount_problem,
    node_problem,
    response_problems,
)
from hetero_dp.model.names import device_id_problem

from .scripted import Scripted, make_devices

A = "example.com/a"


def _node(host: str, container: str = "/dev/x") -> DeviceNode:
    return DeviceNode(host, container)


@pytest.mark.parametrize(
    "host",
    ["/etc/shadow", "../../etc/shadow", "/dev/../etc/shadow", "/dev//null/..", "dev/null", "/dev"],
)
def test_node_host_paths_outside_dev_are_refused(host):
    assert node_problem(_node(host)) is not None


def test_node_symlink_out_of_dev_is_refused(tmp_path):
    dev = tmp_path / "driver" / "dev"
    dev.mkdir(parents=True)
    os.symlink("/etc/passwd", dev / "nvidia0")
    problem = node_problem(_node(str(dev / "nvidia0")))
    assert problem is not None and "/etc/passwd" in problem


def test_node_regular_file_under_a_dev_dir_is_refused(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "secret").write_text("x")
    assert "not a device node" in (node_problem(_node(str(dev / "secret"))) or "")


def test_real_device_nodes_and_unseen_dev_paths_pass(tmp_path):
    dev = tmp_path / "driver" / "dev"
    dev.mkdir(parents=True)
    os.symlink("/dev/null", dev / "nvidiactl")  # a driver root's node, seen here
    assert node_problem(_node("/dev/null")) is None
    assert node_problem(_node(str(dev / "nvidiactl"))) is None
    assert node_problem(_node("/dev/accel-never-here-7")) is None  # judged by name
    assert node_problem(_node("/dev/null", "relative/x")) is not None
    assert node_problem(_node("/dev/null", "/dev/./x")) is not None


@pytest.mark.parametrize(
    ("host", "container"),
    [("/", "/host"), ("/proc", "/p"), ("/sys/kernel", "/s"), ("/data", "/proc/1"), ("data", "/d")],
)
def test_mounts_of_root_proc_sys_or_relative_are_refused(host, container):
    assert mount_problem(Mount(host, container, read_only=False)) is not None


def test_plain_mount_passes():
    assert mount_problem(Mount("/opt/acme/lib", "/usr/local/acme/lib")) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("A\nB", "1"),
        ("A=B", "1"),
        ("A\0", "1"),
        ("", "1"),
        ("LD_PRELOAD", "/tmp/x.so"),
        ("LD_LIBRARY_PATH", "/tmp"),
        ("OK", "a\0b"),
        ("OK", "a\nFORGED=1"),
    ],
)
def test_bad_env_is_refused(key, value):
    assert env_problem(key, value) is not None


def test_oversized_record_is_refused():
    d = Device(
        id="big", resource=A, env={"BIG": "x" * 15000, **{f"K{i}": "y" * 9000 for i in range(8)}}
    )
    problems = device_problems(d)
    assert problems and "per device" in problems[0]


def test_gate_device_strips_refused_items_and_names_the_field():
    d = Device(
        id="d0",
        resource=A,
        nodes=(_node("/dev/null", "/dev/d0"), _node("/etc/shadow", "/dev/d1")),
        mounts=(Mount("/", "/host", read_only=False),),
        env={"OK": "1", "LD_PRELOAD": "/evil.so"},
    )
    g = gate_device(d)
    assert not g.healthy
    assert "nodes[1]" in g.reason and "mounts[0]" in g.reason and "LD_PRELOAD" in g.reason
    assert [n.host_path for n in g.nodes] == ["/dev/null"]
    assert g.mounts == () and dict(g.env) == {"OK": "1"}


def test_response_with_unknown_cdi_name_is_refused():
    r = ContainerResponse(cdi_devices=["acme.com/x=d0", "acme.com/x=ghost"])
    problems = response_problems(r, known_cdi={"acme.com/x=d0"})
    assert len(problems) == 1 and "ghost" in problems[0]


def _hook_edits():
    """What allocate hooks do to the default response, good and bad."""
    bad_node, big = DeviceNode("/etc/shadow", "/dev/x"), "x" * (16 * 1024 + 1)

    def edits(r: ContainerResponse) -> None:
        r.devices = []

    yield "drop the nodes", edits, 0
    yield "nothing", lambda r: None, 0
    yield "add a bad node", lambda r: r.devices.append(bad_node), 1
    yield "add a good node", lambda r: r.devices.append(DeviceNode("/dev/null", "/dev/y")), 0
    yield "add LD_PRELOAD", lambda r: r.envs.update(LD_PRELOAD="/evil.so"), 1
    yield "change a value to hold a newline", lambda r: r.envs.update(VISIBLE="0\n1"), 1
    yield "a new key set to None", lambda r: r.envs.update(NEW=None), 1
    yield "a bad annotation", lambda r: r.annotations.update({"bad key!": "v"}), 1
    yield "a mount of /proc", lambda r: r.mounts.append(Mount("/proc", "/host-proc")), 1
    yield "an oversized value", lambda r: r.annotations.update({"a.io/big": big}), 1
    yield "a node again and again, past the size", lambda r: r.devices.extend(r.devices * 2500), 1


@pytest.mark.parametrize(("what", "edit", "count"), list(_hook_edits()), ids=lambda v: v)
def test_judging_only_what_a_hook_changed_finds_what_judging_all_finds(what, edit, count):
    """The Allocate hot path judges only what the hook changed in a default response
    that passed: the problems (and messages) must be those of judging everything."""
    from hetero_dp.allocation.allocate import build_response

    devices = [
        Device(
            id=f"d{i}",
            resource="acme.com/x",
            nodes=(DeviceNode("/dev/null", f"/dev/x{i}" + "x" * 2000),),
            env={"VISIBLE": str(i), "DRIVER": "v1"},
            annotations={f"acme.com/d{i}": "yes"},
        )
        for i in range(2)
    ]
    default = build_response(devices)
    assert response_problems(default) == []
    edited = ContainerResponse(
        envs=dict(default.envs),
        mounts=list(default.mounts),
        devices=list(default.devices),
        annotations=dict(default.annotations),
    )
    edit(edited)
    problems = response_problems(edited, passed=default)
    assert problems == response_problems(edited)
    assert len(problems) == count, problems


def test_replica_separator_in_a_device_id_is_refused():
    assert "'::'" in (device_id_problem("gpu::1") or "")
    assert device_id_problem("gpu:1") is None


class Hostile(Scripted):
    """Records with a host file, a mount of / and a loader variable beside good ones."""

    hetero_dp_name = "hostile"

    @hookimpl
    def allocate(self, devices: list[Device], response: ContainerResponse) -> None:
        if any(d.id == "dev1" for d in devices):
            response.mounts.append(Mount("/proc", "/host-proc", read_only=False))


async def test_daemon_advertises_refused_devices_unhealthy_and_serves_the_rest(
    fake_kubelet, plugin_runner
):
    good = make_devices(A, 3)
    bad = Device(
        id="evil",
        resource=A,
        nodes=(DeviceNode("/dev/../etc/shadow", "/dev/evil"),),
        env={"LD_PRELOAD": "/tmp/evil.so"},
    )
    separator = Device(id="gpu::1", resource=A, nodes=(DeviceNode("/dev/null", "/dev/g"),))
    backend = Hostile([*good, bad, separator])
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_registered(A)
    devices = await fake_kubelet.wait_devices(A, lambda d: "evil" in d)
    assert not devices["evil"].healthy and devices["dev0"].healthy
    assert "gpu::1" not in devices  # the replica separator: refused at discovery
    reason = daemon.resources[A].state.get("evil").reason
    assert "nodes[0]" in reason and "LD_PRELOAD" in reason
    # a health event saying healthy does not make a refused record serve
    daemon.set_health("hostile", "evil", True, "driver says fine")
    await fake_kubelet.wait_devices(A, lambda d: d["dev0"].healthy)
    assert not daemon.resources[A].state.get("evil").healthy
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(A, ["evil"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    resp = await fake_kubelet.allocate(A, ["dev0"])
    assert resp.envs["VISIBLE"] == "0"
    # what an allocate hook adds passes the same gate
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(A, ["dev1"])
    assert "mounts[0]" in (err.value.details() or "")


class Discovered:
    """A backend with a discover hook only (Allocate answers from its records)."""

    hetero_dp_name = "discovered"

    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices

    @hookimpl
    def discover(self) -> list[Device]:
        return list(self.devices)


async def test_an_allocate_answer_larger_than_the_kubelet_receives_is_refused_with_the_reason(
    fake_kubelet, plugin_runner, caplog
):
    """Each record passes the gate (48 KB, under its 64 KiB per device), but 90 of
    them in one request make a 4.3 MB answer: the kubelet's gRPC client would refuse
    it with a transport error that names no cause. The daemon refuses it instead,
    saying why; a smaller request of the same devices is answered. (The backend has
    no allocate hook: with one, the gate judges each container's answer whole.)"""
    blob = "x" * 16000
    devices = [
        Device(
            id=f"big{i}",
            resource=A,
            nodes=(DeviceNode("/dev/null", f"/dev/big{i}"),),
            env={f"BLOB{i}_{k}": blob for k in range(3)},
        )
        for i in range(90)
    ]
    await plugin_runner.start(Discovered(devices))
    await fake_kubelet.wait_registered(A)
    listed = await fake_kubelet.wait_devices(A, lambda d: len(d) == 90)
    assert all(d.healthy for d in listed.values())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(A, [d.id for d in devices])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the kubelet receives at most" in (err.value.details() or "")
    assert any("Allocate refused" in r.getMessage() for r in caplog.records)
    resp = await fake_kubelet.allocate(A, ["big0", "big1"])
    assert resp.envs["BLOB1_2"] == blob
