"""An API server switch (issue #28 point 5): a control-plane upgrade replaces the API
server; the old one keeps the driver's watch open while it drains and sends nothing
through it. The driver bounds a stream's life, reads discovery when a stream ends
early or fails, and takes up the new version at once, so a pool wiped in that
window is back right after the old server lets go; an idle node asks nothing but
the next stream."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import pytest

from hetero_dp.dra.watch import DEFAULT_TIMEOUT
from hetero_dp.testing.dra import FakeAPIServer

from .backend import DRIVER, RES, Npus


def watch_timeouts(server: FakeAPIServer) -> list[int]:
    return [
        int(parse_qs(urlsplit(r.path).query)["timeoutSeconds"][0])
        for r in server.requests
        if r.method == "WATCH"
    ]


@pytest.mark.parametrize(
    "after",
    [("v1",), ("v1", "v1beta1")],
    ids=["v1beta1-gone", "v1-added"],
)
async def test_a_wipe_while_the_old_server_drains_is_repaired_on_the_new_version(dra, after):
    with FakeAPIServer(versions=("v1beta1",)) as server:
        dra.api = server
        daemon = await dra.start(Npus(2), resync_interval=0)  # only the watch can repair
        driver = daemon.front_end.drivers[RES]
        await server.wait_for(lambda: server.watches >= 1)
        assert driver.publisher.version == "v1beta1"
        before = len(server.writes())
        server.serve(after, drain=120)  # the new server answers; the old one drains
        server.wipe_node("node-a")  # in the window: nothing comes through the old watch
        assert server.devices_of(DRIVER) == {}
        started = time.monotonic()
        server.end_drain()  # the old server exits: its watch is cut
        await server.wait_for(lambda: len(server.devices_of(DRIVER)) == 2, timeout=5)
        repaired = time.monotonic() - started
        # before: with v1beta1 still served the driver stayed on it until the periodic check
        assert driver.publisher.version == "v1"
        # a write is recorded just after it is stored: wait for the record too
        await server.wait_for(lambda: len(server.writes()) > before)
        rewritten = [r.path for r in server.writes()[before:]]
        assert rewritten and all("resource.k8s.io/v1/" in p for p in rewritten), rewritten
        assert repaired < 2.0, repaired
        await dra.stop_all()


async def test_a_watch_never_stays_longer_than_a_minute_and_streams_are_drawn_apart(
    dra, api_server
):
    daemon = await dra.start(Npus(1))
    await api_server.wait_for(lambda: api_server.watches >= 1)
    (first,) = watch_timeouts(api_server)
    # before: 300 s, so a draining server could hold the watch five minutes
    assert DEFAULT_TIMEOUT <= first < 2 * DEFAULT_TIMEOUT <= 60
    watch = daemon.front_end.drivers[RES].slice_watch
    assert watch is not None
    draws = {int(DEFAULT_TIMEOUT * (1 + watch.rand())) for _ in range(50)}
    assert len(draws) > 5  # jittered: a fleet does not reopen in step
    await dra.stop_all()


async def test_an_idle_node_sends_nothing_but_the_next_stream(dra, api_server):
    daemon = await dra.start(Npus(2))
    watch = daemon.front_end.drivers[RES].slice_watch
    assert watch is not None
    await api_server.wait_for(lambda: api_server.watches >= 1)
    watch.timeout_seconds = 1  # short streams from the next one on, so several end here
    api_server.serve(api_server.versions, drain=0)  # ends the first (long) stream
    # cut; discovery; 410 from the new server's watch cache; LIST; a stream again
    await api_server.wait_for(lambda: watch.opened >= 3 and api_server.watches >= 1)
    assert watch.relists == 1
    mark, opened, asked = len(api_server.requests), watch.opened, watch.rediscoveries
    await api_server.wait_for(lambda: watch.opened >= opened + 3, timeout=15)
    counts = api_server.verbs(mark)
    # streams that ran their time: one watch request each, no discovery, no list
    assert set(counts) == {"WATCH"}, counts
    assert watch.rediscoveries == asked
    await dra.stop_all()


async def test_a_stream_the_server_cuts_early_reads_discovery_once(dra, api_server):
    daemon = await dra.start(Npus(1))
    watch = daemon.front_end.drivers[RES].slice_watch
    assert watch is not None
    await api_server.wait_for(lambda: api_server.watches >= 1)
    mark = len(api_server.requests)
    api_server.serve(api_server.versions, drain=0)  # a new server, same versions
    await api_server.wait_for(lambda: watch.opened >= 2 and api_server.watches >= 1)
    counts = api_server.verbs(mark)
    assert counts.get("DISCOVERY") == 1, counts
    assert watch.rediscoveries == 1
    assert daemon.front_end.drivers[RES].publisher.version == "v1"
    await dra.stop_all()
