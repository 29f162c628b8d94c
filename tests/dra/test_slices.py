"""ResourceSlices: they match the device set, follow changes and health, survive deletion,
are refused with a logged reason, validate against the 1.34+ schemas, and go at shutdown."""

from __future__ import annotations

import dataclasses
import logging

import kubernetes_validate
import pytest

from hetero_dp.dra import device_name
from hetero_dp.dra.slices import render_devices, render_slices
from hetero_dp.model.device import Device
from hetero_dp.testing.dra import FakeAPIServer, slice_problems

from .backend import DRIVER, RES, Npus, npu


def pool_of(api: FakeAPIServer) -> tuple[int, set[str]]:
    slices = api.slices_of(DRIVER, "node-a")
    gens = {s["spec"]["pool"]["generation"] for s in slices}
    assert len(gens) == 1, f"slices of one pool disagree on the generation: {gens}"
    return gens.pop(), set(api.devices_of(DRIVER, "node-a"))


async def test_slice_matches_the_devices_with_attributes_and_capacity(dra, api_server):
    backend = Npus(2)
    await dra.start(backend)
    [s] = api_server.slices_of(DRIVER)
    spec = s["spec"]
    assert s["apiVersion"] == "resource.k8s.io/v1"
    assert spec["driver"] == DRIVER and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    devices = {d["name"]: d for d in spec["devices"]}
    assert set(devices) == {device_name(d.id) for d in backend.devices}
    d1 = devices[device_name("NPU-0001")]
    assert d1["attributes"]["id"] == {"string": "NPU-0001"}
    assert d1["attributes"]["index"] == {"int": 1}
    assert d1["attributes"]["numaNode"] == {"int": 1}
    assert d1["attributes"]["pciAddress"] == {"string": "0000:11:00.0"}  # NVML form normalised
    assert d1["attributes"]["product"] == {"string": "Acme N1"}
    assert d1["capacity"] == {"memory": {"value": "16Gi"}}  # 16384Mi, canonical
    assert kubernetes_validate.validate(s, "1.34", strict=True)


@pytest.mark.parametrize(
    ("k8s", "version"),
    [("1.34", "v1"), ("1.35", "v1"), ("1.36", "v1"), ("1.37", "v1"), ("1.34", "v1beta1")],
)
def test_rendered_slices_validate_for_1_34_and_later(k8s, version):
    odd = Device(
        id="GPU-8a1f0c2e-0000-1111-2222-333344445555",
        resource=RES,
        numa_nodes=(1,),
        parent="GPU-parent",
        attributes={
            "migProfile": "1g.5gb",
            "weird key-name.x": True,
            "9lives": 9,
            "ratio": 0.5,
            "too_long": "x" * 65,
            "memory": 5120.0,
            "driverVersion": "550.54.05",
            "cudaComputeCapability": "8.0",
            **{f"extra{i}": i for i in range(40)},  # more than 32 in all: cut, not refused
        },
    )
    devices = render_devices([odd, *(npu(i) for i in range(3))])
    [s] = render_slices(
        driver=DRIVER, node="node-a", devices=devices, generation=3, version=version
    )
    assert kubernetes_validate.validate(s, k8s, strict=True)
    assert slice_problems(s, version) == []
    by_name = {d["name"]: d for d in s["spec"]["devices"]}
    first = by_name[device_name(odd.id)]
    body = first["basic"] if version == "v1beta1" else first
    attrs = body["attributes"]
    assert len(attrs) + len(body["capacity"]) == 32
    assert attrs["weird_key_name_x"] == {"bool": True} and attrs["_9lives"] == {"int": 9}
    assert "too_long" not in attrs and attrs["ratio"] == {"string": "0.5"}
    assert body["capacity"] == {"memory": {"value": "5Gi"}}
    # version-like strings become semantic versions (CEL compares them as versions)
    assert attrs["driverVersion"] == {"version": "550.54.5"}
    assert attrs["cudaComputeCapability"] == {"version": "8.0.0"}


def test_a_big_pool_is_split_into_slices_of_128():
    devices = render_devices([npu(i) for i in range(300)])
    slices = render_slices(driver=DRIVER, node="node-a", devices=devices, generation=7)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert len({s["metadata"]["name"] for s in slices}) == 3
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert len(set(names)) == 300
    assert all(slice_problems(s, "v1") == [] for s in slices)


@pytest.mark.parametrize(
    "node",
    [
        ".".join(["n" * 58] * 4)[:253],  # over 253 in all, cut right after a '.'
        ".".join(["n" * 40] * 6)[:253],  # over 253 in all, cut inside a label
        "node-a",
    ],
)
@pytest.mark.parametrize("driver", [DRIVER, "npu.acme.example.com", "a.b"])
def test_slice_names_are_dns_subdomains_for_any_valid_node_and_driver(node, driver):
    devices = render_devices([npu(i) for i in range(130)])  # two slices: two indexes
    slices = render_slices(driver=driver, node=node, devices=devices, generation=1)
    names = [s["metadata"]["name"] for s in slices]
    assert len(set(names)) == 2
    assert all(slice_problems(s, "v1") == [] for s in slices), names
    again = render_slices(driver=driver, node=node, devices=devices, generation=2)
    assert [s["metadata"]["name"] for s in again] == names  # stable across generations


def test_v1_shape_is_refused_under_v1beta1_and_basic_under_v1():
    devices = render_devices([npu(0)])
    v1 = render_slices(driver=DRIVER, node="n", devices=devices, generation=1)[0]
    as_beta = {**v1, "apiVersion": "resource.k8s.io/v1beta1"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(as_beta, "1.34", strict=True)
    beta = render_slices(driver=DRIVER, node="n", devices=devices, generation=1, version="v1beta1")
    as_v1 = {**beta[0], "apiVersion": "resource.k8s.io/v1"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(as_v1, "1.34", strict=True)


async def test_device_set_changes_bump_the_generation(dra, api_server):
    backend = Npus(2)
    daemon = await dra.start(backend)
    gen, names = pool_of(api_server)
    assert gen == 1 and len(names) == 2
    backend.devices.append(npu(2))
    await daemon.rediscover()
    gen, names = pool_of(api_server)
    assert gen == 2 and device_name("NPU-0002") in names and len(names) == 3
    del backend.devices[0]
    await daemon.rediscover()
    gen, names = pool_of(api_server)
    assert gen == 3 and device_name("NPU-0000") not in names and len(names) == 2
    await daemon.rediscover()  # nothing changed: no new generation, no write
    writes = [r for r in api_server.requests if r.method in ("POST", "PUT")]
    assert pool_of(api_server)[0] == 3
    assert [r for r in api_server.requests if r.method in ("POST", "PUT")] == writes


async def test_attribute_change_is_a_change(dra, api_server):
    backend = Npus(1)
    daemon = await dra.start(backend)
    backend.devices[0] = dataclasses.replace(
        backend.devices[0], attributes={**backend.devices[0].attributes, "firmware": "1.2.4"}
    )
    await daemon.rediscover()
    [dev] = api_server.devices_of(DRIVER).values()
    assert dev["attributes"]["firmware"] == {"version": "1.2.4"}
    assert pool_of(api_server)[0] == 2


async def test_unhealthy_devices_are_withdrawn_and_come_back(dra, api_server):
    backend = Npus(3)
    daemon = await dra.start(backend)
    backend.unhealthy["NPU-0001"] = "ECC errors"
    await daemon.poll_health()
    gen, names = pool_of(api_server)
    assert device_name("NPU-0001") not in names and len(names) == 2 and gen == 2
    del backend.unhealthy["NPU-0001"]
    await daemon.poll_health()
    gen, names = pool_of(api_server)
    assert device_name("NPU-0001") in names and len(names) == 3 and gen == 3


async def test_pushed_health_event_withdraws_the_device(dra, api_server):
    backend = Npus(2)
    daemon = await dra.start(backend)
    daemon.set_health("npus", "NPU-0000", False, "XID 79")  # as a watch hook would
    await api_server.wait_for(lambda: device_name("NPU-0000") not in api_server.devices_of(DRIVER))
    assert len(api_server.devices_of(DRIVER)) == 1


async def test_vanished_slices_are_republished(dra, api_server):
    daemon = await dra.start(Npus(2))
    [s] = api_server.slices_of(DRIVER)
    api_server.delete_slice(s["metadata"]["name"])
    assert api_server.slices_of(DRIVER) == []
    # the watch sees the delete; no periodic check is needed
    await api_server.wait_for(lambda: len(api_server.devices_of(DRIVER)) == 2)
    assert daemon.front_end.drivers[RES].settings.resync_interval == 0
    gen, names = pool_of(api_server)
    assert len(names) == 2 and gen == 1


async def test_stale_slices_of_a_bigger_pool_are_deleted(dra, api_server):
    backend = Npus(130)
    daemon = await dra.start(backend)
    assert len(api_server.slices_of(DRIVER)) == 2
    del backend.devices[100:]
    await daemon.rediscover()
    [s] = api_server.slices_of(DRIVER)
    assert s["spec"]["pool"]["resourceSliceCount"] == 1 and len(s["spec"]["devices"]) == 100


async def test_refused_slice_is_logged_with_the_servers_reason_and_retried(
    dra, api_server, kubelet, caplog
):
    from hetero_dp.kits import observe

    api_server.refuse_slices = 'admission webhook "quota.example.com" denied the request'
    seen: list[dict] = []
    unsubscribe = observe.subscribe(
        lambda event, fields: seen.append(fields) if event == "dra_slice_refused" else None
    )
    try:
        with caplog.at_level(logging.ERROR, logger="hetero_dp.dra"):
            daemon = await dra.start(Npus(2))
    finally:
        unsubscribe()
    assert [f["driver"] for f in seen] == [DRIVER] and "quota.example.com" in seen[0]["reason"]
    refused = [r for r in caplog.records if "refused ResourceSlice" in r.getMessage()]
    assert refused, caplog.text
    assert 'admission webhook "quota.example.com" denied the request' in refused[0].getMessage()
    assert "Forbidden" in refused[0].getMessage()
    assert api_server.slices_of(DRIVER) == []
    # the driver still serves the kubelet ...
    await kubelet.wait_registered(DRIVER)
    # ... and publishes once the server accepts again
    api_server.refuse_slices = None
    await daemon.front_end.drivers[RES].resync()
    assert len(api_server.devices_of(DRIVER)) == 2
    assert daemon.front_end.drivers[RES].publisher.errors == {}


async def test_invalid_slice_reason_from_validation_is_logged(dra, api_server, caplog):
    # a driver name the publisher never makes itself: write a bad slice through its API
    daemon = await dra.start(Npus(1))
    publisher = daemon.front_end.drivers[RES].publisher
    publisher.devices = [{"name": "Bad_Name"}]
    with caplog.at_level(logging.ERROR, logger="hetero_dp.dra"):
        await publisher.sync()
    assert "Bad_Name" in caplog.text and "must be a DNS label" in caplog.text
    assert "HTTP 422 Invalid" in caplog.text


async def test_clean_shutdown_removes_the_pool(dra, api_server):
    daemon = await dra.start(Npus(2))
    assert api_server.slices_of(DRIVER)
    await dra.stop(daemon)
    assert api_server.slices_of(DRIVER) == []
    assert not (dra.registry_dir / f"{DRIVER}-reg.sock").exists()
    assert not (dra.plugins_dir / DRIVER / "dra.sock").exists()


async def test_a_new_process_continues_the_generation(dra, api_server):
    backend = Npus(2)
    daemon = await dra.start(backend)
    backend.devices.append(npu(2))
    await daemon.rediscover()
    assert pool_of(api_server)[0] == 2
    daemon.front_end.drivers[RES].settings.remove_slices_on_stop = False  # a crash leaves slices
    await dra.stop(daemon)
    await dra.start(Npus(2))
    gen, names = pool_of(api_server)
    assert gen == 3 and len(names) == 2


async def test_old_api_server_gets_v1beta1_slices(dra):
    with FakeAPIServer(versions=("v1beta1",)) as old:
        dra.api = old
        daemon = await dra.start(Npus(2))
        assert daemon.front_end.drivers[RES].publisher.version == "v1beta1"
        [s] = old.slices_of(DRIVER, version="v1beta1")
        assert s["apiVersion"] == "resource.k8s.io/v1beta1"
        assert all("basic" in d and "attributes" not in d for d in s["spec"]["devices"])
        assert kubernetes_validate.validate(s, "1.34", strict=True)
        await dra.stop_all()


async def test_unreachable_api_server_is_retried(dra, caplog):
    gone = FakeAPIServer().start()
    dra.api = gone
    gone.stop()  # nothing listens on its port any more
    with caplog.at_level(logging.ERROR, logger="hetero_dp.dra"):
        daemon = await dra.start(Npus(1))
    driver = daemon.front_end.drivers[RES]
    assert not driver.api_ready and "cannot reach the API server" in caplog.text
    with FakeAPIServer(port=gone.port) as back:  # the server is back where it was
        await driver.resync()
        assert driver.api_ready and len(back.devices_of(DRIVER)) == 1
        await dra.stop_all()


async def test_the_periodic_check_republishes_on_its_own(dra, api_server):
    await dra.start(Npus(2), resync_interval=0.05)
    [s] = api_server.slices_of(DRIVER)
    api_server.delete_slice(s["metadata"]["name"])
    await api_server.wait_for(lambda: len(api_server.devices_of(DRIVER)) == 2)
