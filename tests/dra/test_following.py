"""The publisher follows the server: the version it serves now, what it stores
(canonical quantities, so a no-change sync sends nothing), and what others did to the
pool (a watch repairs a wipe; the generation never goes backwards)."""

from __future__ import annotations

import asyncio
import copy

from hetero_dp.dra import device_name
from hetero_dp.dra.api import ResourceAPI
from hetero_dp.dra.publisher import normalize_spec
from hetero_dp.testing.dra import FakeAPIServer

from .backend import DRIVER, RES, Npus, npu


def generations(api: FakeAPIServer) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in api.slices_of(DRIVER, "node-a")}


async def test_an_upgrade_from_v1beta1_to_v1_is_followed(dra):
    with FakeAPIServer(versions=("v1beta1",)) as server:
        dra.api = server
        backend = Npus(2)
        daemon = await dra.start(backend)
        driver = daemon.front_end.drivers[RES]
        assert driver.publisher.version == "v1beta1"
        server.serve(["v1"])  # the control plane was upgraded: v1beta1 is gone
        backend.devices.append(npu(2))
        await daemon.rediscover()
        assert driver.publisher.version == "v1"
        assert len(server.devices_of(DRIVER)) == 3 and generations(server) == {2}
        assert driver.publisher.errors == {}
        await dra.stop(daemon)  # and the pool can still be removed at stop
        assert server.slices_of(DRIVER) == []


async def test_a_rollback_to_v1beta1_is_followed_through_the_watch(dra):
    with FakeAPIServer(versions=("v1",)) as server:
        dra.api = server
        daemon = await dra.start(Npus(1))
        driver = daemon.front_end.drivers[RES]
        server.serve(["v1beta1"])
        server.wipe_node("node-a")
        # the v1 watch ends, its reopening gets 404: the next sync lists, re-detects
        await server.wait_for(lambda: len(server.devices_of(DRIVER)) == 1)
        assert driver.publisher.version == "v1beta1"
        assert len(server.devices_of(DRIVER)) == 1
        await dra.stop_all()


def test_canonical_and_given_quantities_compare_equal():
    ours = {"devices": [{"name": "d", "capacity": {"memory": {"value": "16384Mi"}}}]}
    stored = {"devices": [{"name": "d", "capacity": {"memory": {"value": "16Gi"}}}]}
    assert normalize_spec(ours, "v1") == normalize_spec(stored, "v1")
    beta = {"devices": [{"name": "d", "basic": {"capacity": {"memory": {"value": "16Gi"}}}}]}
    assert normalize_spec(beta, "v1beta1") == normalize_spec(stored, "v1")
    other = copy.deepcopy(stored)
    other["devices"][0]["capacity"]["memory"]["value"] = "15Gi"
    assert normalize_spec(ours, "v1") != normalize_spec(other, "v1")


async def test_a_sync_that_changes_nothing_sends_nothing(dra, api_server):
    backend = Npus(3)
    daemon = await dra.start(backend)
    driver = daemon.front_end.drivers[RES]
    before = len(api_server.writes())
    for _ in range(3):
        await driver.resync()
        await daemon.rediscover()
        await daemon.poll_health()
    assert len(api_server.writes()) == before
    assert generations(api_server) == {1}


async def test_a_wipe_is_repaired_by_the_watch_without_a_periodic_check(dra, api_server):
    daemon = await dra.start(Npus(2), resync_interval=0)  # no periodic check at all
    driver = daemon.front_end.drivers[RES]
    await api_server.wait_for(lambda: api_server.watches >= 1)
    gone = api_server.wipe_node("node-a")  # what a starting kubelet does
    assert gone and api_server.slices_of(DRIVER) == []
    await api_server.wait_for(lambda: len(api_server.devices_of(DRIVER)) == 2)
    assert generations(api_server) == {1}
    assert driver.settings.resync_interval == 0


async def test_someone_elses_edit_is_undone_by_the_watch(dra, api_server):
    await dra.start(Npus(1), resync_interval=0)
    await api_server.wait_for(lambda: api_server.watches >= 1)
    [s] = api_server.slices_of(DRIVER)
    s["spec"]["devices"] = []  # an admin empties the slice
    ResourceAPI(api_server.client(), "v1").replace_slice(s["metadata"]["name"], s)
    name = device_name("NPU-0000")
    await api_server.wait_for(lambda: name in api_server.devices_of(DRIVER))


async def test_the_generation_never_goes_backwards(dra, api_server):
    backend = Npus(2)
    daemon = await dra.start(backend)
    # another writer of the pool (an older instance during a rolling update) got ahead
    [s] = api_server.slices_of(DRIVER)
    s["spec"]["pool"]["generation"] = 30
    s["spec"]["devices"] = s["spec"]["devices"][:1]
    ResourceAPI(api_server.client(), "v1").replace_slice(s["metadata"]["name"], s)
    await api_server.wait_for(
        lambda: generations(api_server) == {31} and len(api_server.devices_of(DRIVER)) == 2
    )
    backend.devices.append(npu(2))
    await daemon.rediscover()
    assert generations(api_server) == {32}


async def test_the_same_content_at_a_higher_generation_is_taken_over_without_a_write(
    dra, api_server
):
    daemon = await dra.start(Npus(2))
    [s] = api_server.slices_of(DRIVER)
    s["spec"]["pool"]["generation"] = 7
    stored = ResourceAPI(api_server.client(), "v1").replace_slice(s["metadata"]["name"], s)
    before = len(api_server.writes())
    cache = daemon.front_end.drivers[RES].publisher.cache
    assert await asyncio.to_thread(cache.wait_seen, stored["metadata"]["resourceVersion"], 10)
    await daemon.front_end.drivers[RES].resync()
    assert len(api_server.writes()) == before
    assert daemon.front_end.drivers[RES].publisher.generation == 7


async def test_the_watch_thread_ends_with_the_driver(dra, api_server, caplog):
    import logging
    import threading

    daemon = await dra.start(Npus(1))
    await api_server.wait_for(lambda: api_server.watches >= 1)
    assert any(t.name == f"dra watch {DRIVER}" for t in threading.enumerate())
    with caplog.at_level(logging.WARNING):
        await dra.stop(daemon)
    # the cut stream's connection is closed, not pooled: the pool removal's list did
    # not read leftover watch chunks as its status line
    assert "BadStatusLine" not in caplog.text and api_server.slices_of(DRIVER) == []
    assert not any(t.name == f"dra watch {DRIVER}" for t in threading.enumerate())
    await api_server.wait_for(lambda: api_server.watches == 0)


async def test_a_kubelet_restart_wipes_the_pool_and_the_driver_restores_it(dra, api_server):
    from hetero_dp.testing.dra import FakeDRAKubelet

    kubelet = FakeDRAKubelet(dra.registry_dir, api=api_server, node="node-a")
    await kubelet.start()
    try:
        await dra.start(Npus(2), resync_interval=0)  # only the watch can repair
        await kubelet.wait_registered(DRIVER)
        await api_server.wait_for(lambda: api_server.watches >= 1)
        deletes = len([r for r in api_server.writes() if r.method == "DELETE"])
        await kubelet.restart()  # wipes the node's slices, then finds the driver again
        await kubelet.wait_registered(DRIVER, after=1)
        await api_server.wait_for(lambda: len(api_server.devices_of(DRIVER)) == 2)
        assert generations(api_server) == {1}
        assert len([r for r in api_server.writes() if r.method == "DELETE"]) == deletes
    finally:
        await kubelet.stop()


async def test_a_newly_served_version_is_taken_up_by_the_scheduled_check(dra):
    # 1.33 -> 1.34: v1 appears next to v1beta1; nothing fails, so only the schedule notices
    with FakeAPIServer(versions=("v1beta1",)) as server:
        dra.api = server
        daemon = await dra.start(Npus(1))
        driver = daemon.front_end.drivers[RES]
        server.serve(["v1", "v1beta1"])
        await driver.resync()
        assert driver.publisher.version == "v1beta1"  # within the interval: unchanged
        driver.publisher.redetect_interval = 0
        await driver.resync()
        assert driver.publisher.version == "v1"
        writes = [r for r in server.writes() if "/v1/" in r.path]
        assert not writes  # the same content under v1: nothing to rewrite
        await dra.stop_all()


async def test_slices_name_the_node_as_owner(dra, api_server):
    await dra.start(Npus(1))
    uid = api_server.nodes["node-a"]["metadata"]["uid"]
    [s] = api_server.slices_of(DRIVER)
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": uid, "controller": True}
    ]


async def test_without_the_node_slices_are_published_without_owner_and_the_log_says_why(
    dra, api_server, caplog
):
    import logging

    dra.create_node = False  # no Node object (or no RBAC to read it)
    with caplog.at_level(logging.WARNING, logger="hetero_dp.dra"):
        daemon = await dra.start(Npus(1))
    assert "cannot read Node node-a" in caplog.text and "no owner reference" in caplog.text
    assert daemon.front_end.drivers[RES].publisher.owner is None
    [s] = api_server.slices_of(DRIVER)
    assert "ownerReferences" not in s["metadata"] and len(s["spec"]["devices"]) == 1


class _Racing(FakeAPIServer):
    """The watch thread re-detects the version while the publisher's LIST under the
    old one is in flight (seen in CI: the LIST got 404, and discovery, read after the
    watch thread had switched, showed no change). ``record`` runs before the answer
    leaves, so the switch lands between the request and its 404."""

    def __init__(self, api: list[ResourceAPI], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.api = api

    def record(self, request):  # type: ignore[no-untyped-def]
        if request.status == 404 and "/v1beta1/" in request.path and self.api:
            self.api[0].version = "v1"  # what the watch thread's rediscover does
        super().record(request)


def test_a_list_racing_the_watch_threads_redetection_is_repeated_under_the_new_version():
    from hetero_dp.dra.reconciler import Reconciler
    from hetero_dp.dra.watch import SliceCache

    holder: list[ResourceAPI] = []
    with _Racing(holder, versions=("v1",)) as server:
        ResourceAPI(server.client(), "v1").create_slice(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": "s-0"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": "node-a",
                    "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                    "devices": [],
                },
            }
        )
        api = ResourceAPI(server.client(), "v1beta1")  # detected before the upgrade
        holder.append(api)
        asked: list[bool] = []
        reconciler = Reconciler(
            api, DRIVER, "node-a", SliceCache(), redetect=lambda: asked.append(True) or False
        )
        assert list(reconciler.relist()) == ["s-0"]
        assert api.version == "v1" and asked == []  # no second discovery read
