"""Reads through the watch (issue 31): the pool is LISTed once and kept by the watch;
a sync that changes nothing asks nothing; a write relists only on a conflict; an
expired watch (410) relists at once, so a pool lost in an outage comes back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hetero_dp.dra.api import APIError, ResourceAPI
from hetero_dp.dra.watch import SliceCache, SliceWatch
from hetero_dp.testing.dra import FakeAPIServer

from .backend import DRIVER, RES, Npus


def verbs_since(server: FakeAPIServer, mark: int) -> dict[str, int]:
    return server.verbs(mark)


async def test_idle_checks_rediscovery_and_health_polls_send_no_request(dra, api_server):
    daemon = await dra.start(Npus(3))
    driver = daemon.front_end.drivers[RES]
    await api_server.wait_for(lambda: api_server.watches >= 1)
    mark = len(api_server.requests)
    for _ in range(5):
        await driver.resync()
        await daemon.rediscover()
        await daemon.poll_health()
    # before issue 31 every sync LISTed the pool: 5 periodic checks + 5 rediscoveries
    assert verbs_since(api_server, mark) == {}


async def test_a_health_change_is_one_update_and_no_list(dra, api_server):
    daemon = await dra.start(Npus(2))
    await api_server.wait_for(lambda: api_server.watches >= 1)
    mark = len(api_server.requests)
    daemon.set_health("npus", "NPU-0000", False, "XID 79")
    await api_server.wait_for(lambda: verbs_since(api_server, mark).get("UPDATE") == 1)
    daemon.set_health("npus", "NPU-0000", True, "")
    await api_server.wait_for(lambda: verbs_since(api_server, mark).get("UPDATE") == 2)
    assert len(api_server.devices_of(DRIVER)) == 2
    # before: LIST, PUT, LIST per change
    assert verbs_since(api_server, mark) == {"UPDATE": 2}


async def test_a_write_that_meets_a_newer_object_relists_once_and_wins(dra, api_server):
    daemon = await dra.start(Npus(2))
    driver = daemon.front_end.drivers[RES]
    await api_server.wait_for(lambda: api_server.watches >= 1)
    api_server.hold_watches()  # the driver's watch lags behind ...
    try:
        [s] = api_server.slices_of(DRIVER)
        s["metadata"]["labels"] = {"touched": "by-someone"}  # ... someone else's write
        ResourceAPI(api_server.client(), "v1").replace_slice(s["metadata"]["name"], s)
        mark = len(api_server.requests)
        daemon.set_health("npus", "NPU-0000", False, "XID 79")
        await api_server.wait_for(lambda: verbs_since(api_server, mark).get("UPDATE") == 2)
        assert len(api_server.devices_of(DRIVER)) == 1
        counts = verbs_since(api_server, mark)
        assert counts == {"UPDATE": 2, "FAILED": 1, "LIST": 1}, counts  # 409, LIST, PUT
        assert driver.publisher.reconciler.conflicts == 1
    finally:
        api_server.hold_watches(False)


@pytest.mark.parametrize("expired_as", ["event", "status"])
async def test_a_pool_lost_in_an_outage_is_back_right_after_the_restart(dra, expired_as):
    with FakeAPIServer(expired_as=expired_as) as server:
        dra.api = server
        daemon = await dra.start(Npus(2), resync_interval=0)  # no periodic check at all
        driver = daemon.front_end.drivers[RES]
        await server.wait_for(lambda: server.watches >= 1)
        server.stop()
        assert server.lose("node-a")  # an etcd restore: gone, and no event says so
        server.start()  # same port; the watch history starts over
        restarted = time.monotonic()
        await server.wait_for(lambda: len(server.devices_of(DRIVER)) == 2, timeout=15)
        repaired = time.monotonic() - restarted
        watch = driver.slice_watch
        assert watch is not None and watch.relists >= 1
        # the first retry comes within the back-off cap (5 s) of the outage's start
        assert repaired < 6.0, repaired
        await dra.stop_all()


async def test_the_watch_resumes_from_bookmarks_without_listing(api_server):
    api = ResourceAPI(api_server.client(), "v1")
    api_server.bookmark_interval = 0.2
    cache = SliceCache()
    cache.watched = True
    changes: list[str] = []
    items, rv = api.list_slices_rv(DRIVER, "node-a")
    cache.replace(items, rv)
    watch = SliceWatch(
        api, DRIVER, "node-a", on_change=changes.append, cache=cache, timeout_seconds=1
    )
    watch.start()
    try:
        # another node's slices move the resourceVersion; bookmarks carry it to us
        other = ResourceAPI(api_server.client(), "v1")
        from hetero_dp.dra.slices import render_slices

        body = render_slices(
            driver=DRIVER, node="node-b", devices=[{"name": "x"}], generation=1, version="v1"
        )[0]
        stored = other.create_slice(body)
        new_rv = stored["metadata"]["resourceVersion"]
        assert await asyncio.to_thread(cache.wait_seen, new_rv, 10)
        await api_server.wait_for(lambda: watch.opened >= 3, timeout=10)
    finally:
        watch.stop()
        assert await asyncio.to_thread(watch.join, 5)
    counts = api_server.verbs()
    assert counts.get("LIST") == 1 and counts.get("WATCH", 0) >= 3, counts
    assert changes == []  # nothing of this node's pool changed
    resumed = [r.path for r in api_server.requests if r.method == "WATCH"]
    assert f"resourceVersion={new_rv}" in resumed[-1], resumed  # from the bookmark


@pytest.mark.parametrize("status", [429, 503])
async def test_a_write_the_server_sheds_is_retried_after_the_back_off(dra, api_server, status):
    daemon = await dra.start(Npus(2), resync_interval=0)  # no periodic check at all
    await api_server.wait_for(lambda: api_server.watches >= 1)
    api_server.refuse_slices, api_server.refuse_status = "overloaded", status
    daemon.set_health("npus", "NPU-0000", False, "XID 79")
    # refused, then tried again by itself after the back-off (0.25-0.5 s, then 0.5-1 s)
    await api_server.wait_for(
        lambda: sum(r.status == status for r in api_server.requests) >= 2, timeout=10
    )
    api_server.refuse_slices = None
    await api_server.wait_for(lambda: len(api_server.devices_of(DRIVER)) == 1, timeout=10)
    assert api_server.verbs().get("LIST") == 1  # the start's; the retries list nothing


def test_a_write_answered_after_a_later_delete_was_watched_is_not_laid_over_it():
    """The create's answer reaches the publisher after the watch has brought its own
    ADDED event and a later DELETED (the kubelet wiping the node right after a
    repair): the slice is gone, and a stale overlay would hide that from every sync
    until the next LIST (the bench_dra_repair benchmark's second wipe stayed
    unrepaired)."""
    cache = SliceCache()
    obj = {"metadata": {"name": "s-0", "resourceVersion": "4"}, "spec": {}}
    assert cache.apply("ADDED", obj)
    assert cache.apply("DELETED", {"metadata": {"name": "s-0", "resourceVersion": "5"}})
    cache.wrote(obj)  # the answer to the create, late
    assert cache.view() == {}
    # an answer that arrives before its event is still laid over the old state
    cache.wrote({"metadata": {"name": "s-1", "resourceVersion": "6"}, "spec": {}})
    assert list(cache.view()) == ["s-1"]


async def test_many_waits_on_the_stand_in_do_not_hold_back_the_daemons_syncs(dra, api_server):
    """FakeAPIServer.wait_for blocks a thread of its own: waits run in the loop's default
    executor took every worker (``min(32, cores + 4)``) when more nodes than that were
    waited on at once, and the syncs the waits were for queued behind them (bench_fleet
    with 8 nodes timed out in its churn phase on a two-core machine)."""
    daemon = await dra.start(Npus(2))
    await api_server.wait_for(lambda: api_server.watches >= 1)
    waits = [
        asyncio.create_task(
            api_server.wait_for(lambda: len(api_server.devices_of(DRIVER)) == 1, timeout=10)
        )
        for _ in range(40)  # more than any default executor has workers
    ]
    await asyncio.sleep(0)  # every wait has started its thread
    daemon.set_health("npus", "NPU-0000", False, "XID 79")  # the sync runs in the executor
    await asyncio.gather(*waits)
    assert len(api_server.devices_of(DRIVER)) == 1


async def test_a_watch_resumed_into_a_410_asks_no_sync_before_it_relists(api_server):
    """After an API server restart the watch resumes from its old resourceVersion and
    the server refuses it with an ERROR event (410). A sync asked when that stream
    opened compared with the cache from before the outage, or LISTed beside the
    relist that follows (two LISTs per node as the server comes back, measured by
    bench_fleet): every sync is now asked after the relist."""
    api = ResourceAPI(api_server.client(), "v1")
    cache = SliceCache()
    cache.watched = True
    asked: list[tuple[str, int]] = []  # (why, LISTs into the cache so far)
    items, rv = api.list_slices_rv(DRIVER, "node-a")
    cache.replace(items, rv)
    watch = SliceWatch(
        api,
        DRIVER,
        "node-a",
        on_change=lambda why: asked.append((why, cache.lists)),
        cache=cache,
        settle=30,  # a quiet resumed stream asks late: however slow the ERROR, no race
    )
    watch.start()
    try:
        await api_server.wait_for(lambda: api_server.watches >= 1)
        api_server.stop()
        api_server.start()  # the history starts over: the old resourceVersion is too old
        await api_server.wait_for(lambda: watch.relists >= 1 and api_server.watches >= 1)
        await api_server.wait_for(lambda: bool(asked), timeout=5)
    finally:
        watch.stop()
        assert await asyncio.to_thread(watch.join, 5)
    assert asked and all(lists >= 2 for _, lists in asked), asked


async def test_two_drivers_of_one_process_probe_the_servers_fields_once(dra, api_server):
    """Issue 31 point 4: the feature probe (a dry-run create) is kept per process, as
    the served version is: a daemon with two drivers asks the server once."""
    from hetero_dp.dra import driver_name_for

    from .backend import npu

    other = "acme.example.com/vpu"
    backend = Npus(2)
    backend.devices.append(npu(7, resource=other))
    await dra.start(backend)
    await api_server.wait_for(
        lambda: (
            len(api_server.devices_of(DRIVER)) == 2
            and len(api_server.devices_of(driver_name_for(other))) == 1
        )
    )
    counts = api_server.verbs()
    assert counts.get("DRYRUN") == 1 and counts.get("DISCOVERY") == 1, counts


class _QuietStream:
    """A watch stream the server keeps open and sends nothing on, until shut down."""

    def __init__(self) -> None:
        self.cut = threading.Event()

    def lines(self):
        self.cut.wait(30)
        return iter(())

    def shutdown(self) -> None:
        self.cut.set()

    def close(self) -> None:
        self.cut.set()


class _OnceDownAPI:
    """A resource API whose first watch finds no server and whose next one is quiet."""

    version = "v1"

    def __init__(self) -> None:
        self.streams: list[_QuietStream] = []

    def list_slices_rv(self, driver, node):
        return [], "5"

    def watch_slices(self, driver, node, resource_version, timeout_seconds):
        if not self.streams:
            self.streams.append(_QuietStream())
            raise APIError(0, "Unreachable", "cannot reach the API server")
        stream = _QuietStream()
        self.streams.append(stream)
        return stream


async def test_a_quiet_stream_resumed_after_a_failure_still_asks_for_a_sync():
    """The other side of waiting for the first line: a resumed stream that is good
    and brings nothing (no change while the driver could not see) still asks for
    the sync that writes what failed meanwhile, after ``settle`` seconds."""
    from hetero_dp.dra.client import Backoff

    api = _OnceDownAPI()
    cache = SliceCache()
    cache.watched = True
    cache.replace([], "5")
    asked = threading.Event()
    watch = SliceWatch(
        api,  # type: ignore[arg-type]
        DRIVER,
        "node-a",
        on_change=lambda why: asked.set(),
        cache=cache,
        backoff=Backoff(base=0.01),
        settle=0.05,
    )
    watch.start()
    try:
        assert await asyncio.to_thread(asked.wait, 10)
        assert len(api.streams) == 2 and cache.lists == 1  # resumed, not listed again
    finally:
        watch.stop()
        for stream in api.streams:
            stream.shutdown()
        assert await asyncio.to_thread(watch.join, 5)
