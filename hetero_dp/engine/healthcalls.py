"""``check_health`` over many devices, each under the hook timeout.

A blocking hook runs over chunks of devices, one worker call per chunk (the event
loop handles a few dozen futures for 10,000 devices, not 10,000); each device is
still under the timeout: when one hangs, it alone is judged stuck, its thread is
given up on, and the rest of its chunk goes on in another thread. An ``async def``
hook runs on the loop, one call per device.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from hetero_dp.engine.hookrunner import (
    WORKERS,
    HookRunner,
    hook_raised,
    hook_timed_out,
    runs_on_loop,
)
from hetero_dp.engine.workers import PoolExhausted
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError

HEALTH_CHUNK = 256  # devices per worker call in a health poll
HEALTH_YIELD_EVERY = 8

Verdict = tuple[bool, str]


class _HealthBatch:
    """Devices one worker call checks in turn; ``current`` is (index, start time) of
    the device at hand, set by the worker (one assignment, read by the loop)."""

    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices
        self.current: tuple[int, float] | None = None
        self.results: dict[str, Verdict | BackendError] = {}
        self.abandoned = False


async def check_health_many(
    runner: HookRunner,
    devices: list[Device],
    on_error: Callable[[BackendError], None] | None = None,
) -> dict[str, Verdict]:
    """A verdict per device ID (a failure, a timeout or a call still stuck is an
    Unhealthy verdict naming the hook and the limit)."""
    function = runner.hook_function("check_health")
    if function is None or not devices:
        return {}
    out: dict[str, Verdict] = {}

    def failed(device_id: str, e: BackendError) -> None:
        e.device = device_id
        if on_error is not None:
            on_error(e)
        out[device_id] = (False, str(e))

    if runs_on_loop(function):

        async def one(d: Device) -> None:
            try:
                out[d.id] = await runner.call("check_health", key=d.id, device=d)
            except BackendError as e:
                failed(d.id, e)

        await asyncio.gather(*(one(d) for d in devices))
        return out
    limit = runner.limit("check_health")
    todo = []
    for d in devices:
        if (stuck := runner.still_stuck("check_health", d.id, limit)) is not None:
            failed(d.id, stuck)
        else:
            todo.append(d)
    size = max(1, min(HEALTH_CHUNK, -(-len(todo) // WORKERS)))
    chunks = [todo[i : i + size] for i in range(0, len(todo), size)]
    await asyncio.gather(*(_check_chunk(runner, function, c, limit, out, failed) for c in chunks))
    return out


async def _check_chunk(
    runner: HookRunner,
    function: Any,
    devices: list[Device],
    limit: float,
    out: dict[str, Verdict],
    failed: Callable[[str, BackendError], None],
) -> None:
    name = runner.name
    while devices:
        batch = _HealthBatch(devices)
        try:
            cf = runner.pool.submit(_run_batch, runner, function, batch)
        except PoolExhausted as e:
            for d in devices:
                failed(d.id, BackendError(f"backend {name!r} hook check_health: {e}"))
            return
        fut = asyncio.wrap_future(cf)
        devices = []
        while True:
            current = batch.current
            wait = limit if current is None else limit - (time.monotonic() - current[1])
            done, _ = await asyncio.wait({fut}, timeout=max(wait, 0.001))
            if done:
                break
            current = batch.current
            if current is None or time.monotonic() - current[1] < limit:
                continue  # still queued, or the device at hand is within its time
            index, started = current
            key = batch.devices[index].id
            batch.abandoned = True
            runner.give_up(runner.pool, cf, "check_health", key, started)
            failed(key, BackendError(hook_timed_out(name, "check_health", limit, function, key)))
            devices = batch.devices[index + 1 :]  # the rest go on in another thread
            break
        for device_id, verdict in list(batch.results.items()):
            if isinstance(verdict, BackendError):
                failed(device_id, verdict)
            else:
                out[device_id] = verdict


def _run_batch(runner: HookRunner, function: Any, batch: _HealthBatch) -> None:
    """In a worker thread: check each device in turn, saying which one is at hand; each
    verdict through the hook's result check (:meth:`HookRunner.checked`)."""
    for i, d in enumerate(batch.devices):
        if batch.abandoned:
            return
        if i % HEALTH_YIELD_EVERY == HEALTH_YIELD_EVERY - 1:
            # give the GIL to the event loop now and then: a long chunk of cheap
            # Python checks would otherwise hold it for a whole switch interval
            # (5 ms) at a time, and an Allocate waits behind it
            time.sleep(0)
        batch.current = (i, time.monotonic())
        try:
            verdict: Verdict | BackendError = runner.checked("check_health", function(device=d))
        except BackendError as e:
            verdict = e
        except Exception as e:
            verdict = hook_raised(runner.name, "check_health", e, function)
        if batch.abandoned:  # this call came back after it was given up on
            return
        batch.results[d.id] = verdict
