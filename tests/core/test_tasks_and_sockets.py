"""kits/tasks.py (long-lived tasks by name) and kits/sockets.py (one unix-socket probe)."""

from __future__ import annotations

import asyncio
import logging
import socket

from hetero_dp.kits.mappings import deep_merge
from hetero_dp.kits.sockets import socket_listens
from hetero_dp.kits.tasks import Tasks


async def test_a_name_started_again_replaces_its_task():
    tasks = Tasks("test")
    first = tasks.start("loop", asyncio.Event().wait())
    second = tasks.start("loop", asyncio.Event().wait())
    await asyncio.sleep(0)  # let the cancellation land
    assert first.cancelled() and not second.done()
    assert tasks.names() == ["loop"]
    assert tasks.cancel("loop") and not tasks.cancel("loop")
    assert await tasks.stop(1.0) == []


async def test_a_task_that_dies_is_logged_with_its_name(caplog):
    tasks = Tasks("test")
    done = asyncio.Event()

    async def boom() -> None:
        done.set()
        raise RuntimeError("the loop broke")

    with caplog.at_level(logging.ERROR, logger="hetero_dp.kits.tasks"):
        task = tasks.start("health poll", boom())
        await asyncio.wait([task], timeout=5)
    assert done.is_set()
    assert any("'health poll'" in r.getMessage() for r in caplog.records)
    assert tasks.names() == []


async def test_stop_names_the_tasks_that_did_not_end():
    tasks = Tasks("test")
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # refuses to end

    tasks.start("stubborn", stubborn())
    await asyncio.sleep(0)
    assert await tasks.stop(0.05) == ["test: stubborn"]
    release.set()


def test_socket_listens_tells_live_stale_and_absent(tmp_path):
    live, stale, plain = tmp_path / "live.sock", tmp_path / "stale.sock", tmp_path / "file"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(live))
    server.listen(1)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(stale))  # bound, never listening: connecting is refused
    plain.write_text("")
    try:
        assert socket_listens(live) is True
        assert socket_listens(stale) is False
        assert socket_listens(plain) is None
        assert socket_listens(tmp_path / "missing") is None
    finally:
        server.close()
        dead.close()


def test_deep_merge_merges_nested_mappings_and_changes_neither_input():
    base = {"a": {"b": 1, "c": 2}, "d": 1}
    top = {"a": {"c": 3}, "d": {"e": 1}}
    assert deep_merge(base, top) == {"a": {"b": 1, "c": 3}, "d": {"e": 1}}
    assert base == {"a": {"b": 1, "c": 2}, "d": 1} and top == {"a": {"c": 3}, "d": {"e": 1}}
