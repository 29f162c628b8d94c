"""Device health to the kubelet: the DRA health stream (KEP-4680) and pod status."""

from __future__ import annotations

import logging

import pytest

from hetero_dp import Lost
from hetero_dp.dra import device_name
from hetero_dp.testing.dra import ClaimRef, FakeAPIServer, make_claim

from .backend import DRIVER, RES, Npus


@pytest.mark.parametrize("version", ["v1alpha1", "v1beta1", "v1"])
async def test_the_health_stream_lists_every_device_and_follows_changes(
    dra, api_server, kubelet, version
):
    daemon = await dra.start(Npus(2))
    await kubelet.wait_registered(DRIVER)
    await kubelet.watch_health(DRIVER, version)
    n0, n1 = device_name("NPU-0000"), device_name("NPU-0001")
    await kubelet.wait_for(lambda: set(kubelet.health.get(DRIVER, {})) == {n0, n1})
    assert {h.health for h in kubelet.health[DRIVER].values()} == {"HEALTHY"}
    assert {h.pool for h in kubelet.health[DRIVER].values()} == {"node-a"}
    assert all(h.last_updated > 0 for h in kubelet.health[DRIVER].values())

    daemon.set_health("npus", "NPU-0001", False, "XID 79: fallen off the bus")
    await kubelet.wait_for(lambda: kubelet.health[DRIVER][n1].health == "UNHEALTHY")
    if version != "v1alpha1":  # v1alpha1 has no message field
        assert kubelet.health[DRIVER][n1].message == "XID 79: fallen off the bus"
    assert kubelet.health[DRIVER][n0].health == "HEALTHY"
    assert kubelet.health_errors == []


async def test_health_shows_in_the_pod_status(dra, api_server, kubelet):
    daemon = await dra.start(Npus(1))
    await kubelet.wait_registered(DRIVER)
    await kubelet.watch_health(DRIVER)
    name = device_name("NPU-0000")
    claim = api_server.add_claim(make_claim("train", [("npu", name)], driver=DRIVER, pool="node-a"))
    [entry] = (await kubelet.prepare_pod("pod-a", DRIVER, [ClaimRef.of(claim)])).values()
    await kubelet.wait_for(lambda: name in kubelet.health.get(DRIVER, {}))
    # kubelet 1.36 names the device by its first CDI device ID
    first_cdi = entry.devices[0].cdi_device_ids[0]
    assert first_cdi.startswith(f"{DRIVER}/")
    assert kubelet.pod_resource_status("pod-a") == [
        {
            "name": "claim:train/npu",
            "resources": [{"resourceID": first_cdi, "health": "Healthy"}],
        }
    ]
    daemon.set_health("npus", "NPU-0000", False, "ECC errors")
    await kubelet.wait_for(
        lambda: kubelet.pod_resource_status("pod-a")[0]["resources"][0]["health"] == "Unhealthy"
    )


async def test_health_streams_end_when_the_driver_stops(dra, api_server, kubelet):
    daemon = await dra.start(Npus(1))
    await kubelet.wait_registered(DRIVER)
    await kubelet.watch_health(DRIVER)
    await kubelet.wait_for(lambda: bool(kubelet.health.get(DRIVER)))
    await dra.stop(daemon)  # returns: no stream holds the server's stop
    assert not daemon.front_end.drivers[RES].running


# --- device taints (KEP-5055) where the server keeps them ---------------------------


async def test_unhealthy_devices_are_tainted_where_the_server_keeps_taints(dra, caplog):
    with FakeAPIServer(features=("DRADeviceTaints",)) as server:
        dra.api = server
        with caplog.at_level(logging.INFO, logger="hetero_dp.dra"):
            daemon = await dra.start(Npus(2))
        assert "serves device taints (DRADeviceTaints)" in caplog.text
        daemon.set_health("npus", "NPU-0001", False, "XID 79: fallen off the bus")
        name = device_name("NPU-0001")
        await server.wait_for(lambda: bool(server.devices_of(DRIVER).get(name, {}).get("taints")))
        [taint] = server.devices_of(DRIVER)[name]["taints"]
        assert taint["key"] == f"{DRIVER}/unhealthy" and taint["effect"] == "NoSchedule"
        assert taint["value"] == "XID-79-fallen-off-the-bus"
        assert len(server.devices_of(DRIVER)) == 2  # still listed, not withdrawn
        # the server added timeAdded; a sync that changes nothing still sends nothing
        # (the PUT is recorded just after the store changed: wait for its record)
        await server.wait_for(lambda: any(r.method == "PUT" for r in server.writes()))
        before = len(server.writes())
        await daemon.front_end.drivers[RES].resync()
        assert len(server.writes()) == before
        daemon.set_health("npus", "NPU-0001", True)
        await server.wait_for(lambda: "taints" not in server.devices_of(DRIVER)[name])
        await dra.stop_all()


async def test_a_lost_device_is_tainted_no_execute(dra):
    """A backend that reports a device Lost (gone until repaired: a GPU fallen off
    the bus) gets a NoExecute taint, so the pods that hold it are evicted; an
    unhealthy one keeps NoSchedule."""
    with FakeAPIServer(features=("DRADeviceTaints",)) as server:
        dra.api = server
        daemon = await dra.start(Npus(2))
        daemon.set_health("npus", "NPU-0000", False, "ECC errors")
        daemon.set_health("npus", "NPU-0001", False, Lost("XID 79: fallen off the bus"))
        n0, n1 = device_name("NPU-0000"), device_name("NPU-0001")

        def effects() -> dict[str, str]:
            devices = server.devices_of(DRIVER)
            return {n: t["effect"] for n in (n0, n1) for t in devices.get(n, {}).get("taints", [])}

        await server.wait_for(lambda: len(effects()) == 2)
        assert effects() == {n0: "NoSchedule", n1: "NoExecute"}
        daemon.set_health("npus", "NPU-0001", True, "reset")
        await server.wait_for(lambda: effects() == {n0: "NoSchedule"})
        await dra.stop_all()


async def test_without_taints_unhealthy_devices_are_withdrawn_and_the_log_says_why(
    dra, api_server, caplog
):
    with caplog.at_level(logging.INFO, logger="hetero_dp.dra"):
        daemon = await dra.start(Npus(2))
    assert "does not serve device taints (DRADeviceTaints)" in caplog.text
    daemon.set_health("npus", "NPU-0001", False, "ECC errors")
    name = device_name("NPU-0001")
    await api_server.wait_for(lambda: name not in api_server.devices_of(DRIVER))
    assert not [s for s in api_server.slices_of(DRIVER) if "probe" in s["metadata"]["name"]]


async def test_the_health_list_is_sent_again_as_a_heartbeat(dra, api_server, kubelet):
    daemon = await dra.start(Npus(1))
    daemon.front_end.drivers[RES].health.heartbeat = 0.05
    await kubelet.wait_registered(DRIVER)
    await kubelet.watch_health(DRIVER, "v1")
    await kubelet.wait_for(lambda: kubelet.health_messages.get(DRIVER, 0) >= 3)
    [status] = kubelet.health[DRIVER].values()
    assert status.health == "HEALTHY"  # nothing changed; the list came again anyway
