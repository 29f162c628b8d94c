"""The daemon's own loops survive what a round of them raises (issue #29, 'every
thread that watches something survives any exception'): the health poll and the
rediscovery loop ended at their first unexpected exception (Tasks logged it once),
after which no device was polled, or no new device seen, again, in silence."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from .scripted import Scripted, make_devices

A = "example.com/loops"


def _failing_twice(real: Any) -> Any:
    calls = 0

    async def call(*args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError("a bug in a publisher")
        await real(*args)

    return call


async def test_a_health_poll_round_that_raises_does_not_end_the_polls(
    fake_kubelet, plugin_runner, caplog: pytest.LogCaptureFixture
):
    backend = Scripted(make_devices(A, 2))
    daemon = await plugin_runner.start(backend, config={"healthInterval": 0.05})
    await fake_kubelet.wait_registered(A)
    caplog.set_level(logging.INFO)
    daemon.health.poll = _failing_twice(daemon.health.poll)  # type: ignore[method-assign]
    backend.unhealthy["dev0"] = "overheated"
    await fake_kubelet.wait_devices(A, lambda d: not d["dev0"].healthy)
    assert daemon.resources[A].state.get("dev0").reason == "overheated"
    failed = [r for r in caplog.records if "health poll failed" in r.getMessage()]
    assert len(failed) == 1  # the repeat is not logged again at once
    assert "tried again next round" in failed[0].getMessage()


async def test_a_rediscovery_round_that_raises_does_not_end_the_loop(
    fake_kubelet, plugin_runner, caplog: pytest.LogCaptureFixture
):
    backend = Scripted(make_devices(A, 2))
    daemon = await plugin_runner.start(backend, config={"rediscoverInterval": 0.05})
    await fake_kubelet.wait_registered(A)
    daemon.rediscover = _failing_twice(daemon.rediscover)  # type: ignore[method-assign]
    backend.devices = make_devices(A, 3)
    await fake_kubelet.wait_devices(A, lambda d: "dev2" in d)
    assert any("rediscovery of scripted failed" in r.getMessage() for r in caplog.records)
