"""Shared helpers for the operations tests: real HTTP, event-based waits."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from hetero_dp.engine.daemon import Daemon
from hetero_dp.kits import observe
from hetero_dp.ops import operations


async def http_get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    """A real HTTP request through urllib (in a thread: the daemon's loop must answer)."""

    def fetch() -> tuple[int, str]:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    return await asyncio.to_thread(fetch)


def port_of(daemon: Daemon) -> int:
    assert operations.of(daemon).server is not None, "metrics.address not set"
    return operations.of(daemon).server.port


async def scrape(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Scrape /metrics over HTTP: {(sample name, sorted labels): value}."""
    status, text = await http_get(port_of(daemon), "/metrics")
    assert status == 200, text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    """One sample's value; 0 when absent (a counter never incremented)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def expect_event(
    event: str, predicate: Callable[[dict], bool] = lambda f: True
) -> asyncio.Future[dict]:
    """Subscribe now, await later: returns a future resolved by the first matching event."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[dict] = loop.create_future()

    def on(name: str, fields: dict) -> None:
        if name == event and predicate(fields) and not fut.done():
            fut.set_result(fields)

    unsubscribe = observe.subscribe(on)
    fut.add_done_callback(lambda _f: unsubscribe())
    return fut


async def wait_until(daemon: Daemon, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` holds, re-checked on every observe event (no polling)."""
    if predicate():
        return
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def on(_name: str, _fields: dict) -> None:
        # events fire before some state settles (a flag set right after): check on the loop
        loop.call_soon(lambda: done.set() if predicate() else None)

    unsubscribe = observe.subscribe(on)
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        unsubscribe()


async def wait_ready(daemon: Daemon, timeout: float = 10.0) -> None:
    await wait_until(
        daemon,
        lambda: daemon.ready.is_set() and daemon.readiness()[0],
        timeout,
    )
