"""Fuzzed plugin-returned records (issue #29): whatever a backend puts into a
Device record, the gate never raises; a record it passes carries only what may go
into a container; a refused one is Unhealthy with a reason naming the field and
keeps none of the refused items; the Allocate answer built from passed records
converts to protobuf. Then a live daemon serving a backend of random records
keeps serving: no INTERNAL for a healthy device, only clean refusals."""

from __future__ import annotations

import random

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_dp import Device, DeviceNode, Mount
from hetero_dp.allocation.allocate import build_response
from hetero_dp.allocation.gate import (
    Refused,
    annotation_problem,
    device_problems,
    env_problem,
    gate_device,
    mount_problem,
    node_problem,
)
from hetero_dp.deviceplugin.convert import container_response_to_pb
from hetero_dp.model.names import device_id_problem
from tests.core.scripted import Scripted

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
paths = st.one_of(
    text,
    st.sampled_from(
        [
            "/dev/null",
            "/dev/accel0",
            "/dev/../etc/shadow",
            "/etc/passwd",
            "../../etc/shadow",
            "/",
            "/proc",
            "/sys/kernel",
            "/run/nvidia/driver/dev/nvidia0",
            "/dev//x",
            "/dev/./x",
            "relative",
            "/opt/lib",
        ]
    ),
)
env_keys = st.one_of(text, st.sampled_from(["LD_PRELOAD", "PATH", "A=B", "A\nB", "OK_1", "-x"]))
nodes = st.builds(DeviceNode, paths, paths, st.sampled_from(["r", "rw", "rwm"]), st.booleans())
mounts = st.builds(Mount, paths, paths, st.booleans(), st.booleans())
records = st.builds(
    Device,
    id=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20),
    resource=st.just("example.com/fuzz"),
    nodes=st.lists(nodes, max_size=4).map(tuple),
    mounts=st.lists(mounts, max_size=3).map(tuple),
    env=st.dictionaries(env_keys, text, max_size=4),
    annotations=st.dictionaries(text, text, max_size=3),
)


@FUZZ
@given(device=records)
def test_gate_never_raises_and_what_passes_is_clean(device):
    gated = gate_device(device)
    if gated is device:
        assert device_problems(device) == []
    else:
        assert not gated.healthy and isinstance(gated.reason, Refused)
        assert gated.reason.startswith("refused by the container gate: ")
    # nothing a refused record keeps may go into a container
    assert all(node_problem(n) is None for n in gated.nodes)
    assert all(mount_problem(m) is None for m in gated.mounts)
    assert all(env_problem(k, v) is None for k, v in gated.env.items())
    assert all(annotation_problem(k, v) is None for k, v in gated.annotations.items())
    if device_id_problem(gated.id) is None:
        container_response_to_pb(build_response([gated]))


def _random_record(rng: random.Random, i: int) -> Device:
    if rng.random() < 0.4:  # a clean one among the hostile
        return Device(
            id=f"d{i}", resource="example.com/fuzz", nodes=(DeviceNode("/dev/null", "/dev/x"),)
        )
    pick = rng.choice
    hostile = [
        "/etc/shadow",
        "/dev/../etc/passwd",
        "/dev/null",
        "/",
        "/proc/1",
        "rel",
        f"/dev/fuzz{i}",
    ]
    return Device(
        id=pick([f"d{i}", f"d{i}::1", f"d{i}\n", f"d{i}/x", f"d{i}"]),
        resource="example.com/fuzz",
        nodes=tuple(DeviceNode(pick(hostile), pick([*hostile[2:], "/dev/x"])) for _ in range(2)),
        mounts=tuple(Mount(pick(hostile), pick(["/data", "/", "/sys/x"])) for _ in range(1)),
        env={pick(["OK", "LD_PRELOAD", "A B", "X"]): pick(["1", "a\nb", "\x00", "v"])},
    )


async def test_a_daemon_serving_random_records_keeps_serving(fake_kubelet, plugin_runner):
    rng = random.Random(1729)
    backend = Scripted([_random_record(rng, i) for i in range(60)])
    await plugin_runner.start(backend)
    res = "example.com/fuzz"
    devices = await fake_kubelet.wait_devices(res, lambda d: len(d) > 0)
    assert not [i for i in devices if "::" in i or "\n" in i or "/" in i]
    for device_id, d in devices.items():
        try:
            resp = await fake_kubelet.allocate(res, [device_id])
        except grpc.aio.AioRpcError as e:
            assert not d.healthy and e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
            continue
        assert d.healthy
        for spec in resp.devices:
            assert spec.host_path.startswith("/dev/") and ".." not in spec.host_path
        assert all(m.host_path not in ("/",) for m in resp.mounts)
        assert "LD_PRELOAD" not in resp.envs
    assert any(d.healthy for d in devices.values())
