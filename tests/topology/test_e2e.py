"""Sharing and preferred allocation end to end: a daemon over real unix sockets
against the fake kubelet."""

from __future__ import annotations

import itertools

import grpc
import pytest

from hetero_dp import ConfigError, Device, Link, hookimpl

from ..core.scripted import Scripted, make_devices

RES = "example.com/accel"
SHARED = "example.com/accel.shared"


def sharing(replicas: int = 4, **extra: object) -> dict[str, object]:
    entry = {"name": RES, "replicas": replicas, **extra.pop("entry", {})}  # type: ignore[dict-item]
    return {"sharing": {"timeSlicing": {**extra, "resources": [entry]}}}


async def test_replicated_resource_advertises_n_times_replicas(fake_kubelet, plugin_runner):
    await plugin_runner.start(Scripted(make_devices(RES, 3)), config=sharing(4))
    devices = await fake_kubelet.wait_devices(RES, lambda d: len(d) == 12)
    assert sorted(devices) == sorted(f"dev{i}::{n}" for i in range(3) for n in range(4))
    # Replicas keep their device's NUMA node, so topology hints still work.
    assert {devices[f"dev1::{n}"].numa_nodes for n in range(4)} == {(1,)}


async def test_rename_and_per_device_selection_split_the_resource(fake_kubelet, plugin_runner):
    config = sharing(2, renameByDefault=True, entry={"devices": [0, "dev2"]})
    await plugin_runner.start(Scripted(make_devices(RES, 4)), config=config)
    shared = await fake_kubelet.wait_devices(SHARED, lambda d: len(d) == 4)
    whole = await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    assert sorted(shared) == ["dev0::0", "dev0::1", "dev2::0", "dev2::1"]
    assert sorted(whole) == ["dev1", "dev3"]


async def test_allocate_two_replicas_of_one_device_yields_it_once(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 2))
    await plugin_runner.start(backend, config=sharing(4))
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 8)
    resp = await fake_kubelet.allocate(RES, ["dev1::0", "dev1::3"])
    assert backend.allocated == [["dev1"]]
    assert resp.envs["VISIBLE"] == "1"
    assert resp.envs["SCRIPTED_COUNT"] == "1"
    assert [d.host_path for d in resp.devices].count("/dev/dev1") == 1
    # Replicas of two devices give both, each once.
    resp = await fake_kubelet.allocate(RES, ["dev0::2", "dev1::1", "dev0::1"])
    assert backend.allocated[-1] == ["dev0", "dev1"]
    assert resp.envs["VISIBLE"] == "0,1"


async def test_fail_requests_greater_than_one_rejects_two_replicas(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 2))
    config = sharing(4, failRequestsGreaterThanOne=True)
    await plugin_runner.start(backend, config=config)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 8)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(RES, ["dev1::0", "dev1::3"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dev1::0, dev1::3" in err.value.details()
    assert "failRequestsGreaterThanOne" in err.value.details()
    assert backend.allocated == []
    await fake_kubelet.allocate(RES, ["dev0::2"])  # one replica is fine
    assert backend.allocated == [["dev0"]]


async def test_health_of_a_device_fans_out_to_all_its_replicas(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 2))
    await plugin_runner.start(backend, config=sharing(3))
    res = await fake_kubelet.wait_registered(RES)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 6)
    assert backend.watch_started.wait(5)
    backend.sinks[0].set_health("dev1", False, "XID 79")
    devices = await fake_kubelet.wait_devices(
        RES, lambda d: not any(d[f"dev1::{n}"].healthy for n in range(3))
    )
    assert all(devices[f"dev0::{n}"].healthy for n in range(3))
    assert res.allocatable == 3 and res.capacity == 6
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(RES, ["dev1::2"])
    assert "dev1::2" in err.value.details()
    backend.sinks[0].set_health("dev1", True, "recovered")
    await fake_kubelet.wait_devices(RES, lambda d: all(x.healthy for x in d.values()))
    assert res.allocatable == 6


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("distributed", ["dev1", "dev2"]), ("packed", ["dev0", "dev0"])],
)
async def test_preferred_allocation_of_replicas_follows_the_policy(
    fake_kubelet, plugin_runner, policy, expected
):
    config = {**sharing(4), "resources": {RES: {"replicaPolicy": policy}}}
    await plugin_runner.start(Scripted(make_devices(RES, 3)), config=config)
    devices = await fake_kubelet.wait_devices(RES, lambda d: len(d) == 12)
    # dev0::0 is in use by another pod: not among the candidates.
    available = [i for i in devices if i != "dev0::0"]
    chosen = await fake_kubelet.preferred_allocation(RES, available, [], 2)
    assert [c.split("::")[0] for c in chosen] == expected


class Linked(Scripted):
    """Eight devices wired as a DGX-1 hybrid cube-mesh (NVLink counts per pair)."""

    MESH = {
        (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2,
        (2, 3): 2, (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2,
        (5, 7): 1, (6, 7): 2,
    }  # fmt: skip

    @hookimpl
    def links(self, devices: list[Device]) -> list[Link]:
        out = []
        for a, b in itertools.combinations(range(8), 2):
            count = self.MESH.get((a, b), 0)
            score = 100 * count if count else (20 if a // 4 == b // 4 else 10)
            out.append(Link(f"dev{a}", f"dev{b}", score, f"NV{count}" if count else "SYS"))
        return out


async def test_preferred_allocation_uses_backend_links(fake_kubelet, plugin_runner):
    devices = [Device(f"dev{i}", RES, index=i, numa_nodes=(i // 4,)) for i in range(8)]
    await plugin_runner.start(Linked(devices))
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 8)
    ids = [f"dev{i}" for i in range(8)]
    chosen = await fake_kubelet.preferred_allocation(RES, ids, ["dev5"], 4)
    assert sorted(chosen) == ["dev4", "dev5", "dev6", "dev7"]  # the NVLink quad, score 900
    # Without dev6 the best trio with dev5 leaves its NUMA node: dev1-dev5 NV2 (200),
    # dev1-dev2 NV2 (200), dev2-dev5 SYS (10) make 410, beating dev4+dev7's 400.
    rest = [i for i in ids if i != "dev6"]
    chosen = await fake_kubelet.preferred_allocation(RES, rest, ["dev5"], 3)
    assert sorted(chosen) == ["dev1", "dev2", "dev5"]


async def test_preferred_allocation_of_linked_replicas_prefers_linked_devices(
    fake_kubelet, plugin_runner
):
    devices = [Device(f"dev{i}", RES, index=i) for i in range(8)]
    config = {**sharing(2), "resources": {RES: {"replicaPolicy": "distributed"}}}
    await plugin_runner.start(Linked(devices), config=config)
    advertised = await fake_kubelet.wait_devices(RES, lambda d: len(d) == 16)
    # Equal load everywhere: after dev3, the tie goes to an NV2 neighbour (dev0 or dev2).
    chosen = await fake_kubelet.preferred_allocation(RES, list(advertised), ["dev3::0"], 2)
    assert chosen[0] == "dev3::0" and chosen[1].split("::")[0] in {"dev0", "dev2"}


async def test_sharing_a_device_that_does_not_exist_stops_start_up(fake_kubelet, plugin_runner):
    config = sharing(2, entry={"devices": [0, 9]})
    with pytest.raises(ConfigError) as err:
        await plugin_runner.start(Scripted(make_devices(RES, 2)), config=config)
    assert err.value.field == "sharing.timeSlicing.resources[0].devices[1]"
    assert "'9' does not exist" in str(err.value)
    assert fake_kubelet.registrations == []


async def test_replicas_below_two_stop_start_up(fake_kubelet, plugin_runner):
    with pytest.raises(ConfigError) as err:
        await plugin_runner.start(Scripted(make_devices(RES, 2)), config=sharing(1))
    assert err.value.field == "sharing.timeSlicing.resources[0].replicas"
