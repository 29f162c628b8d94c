"""The core's waits never lose a cancellation (asyncio.wait_for on
CPython 3.10/3.11 can: docs/sources.md#asyncio-wait-for) and leave locks as they found them."""

from __future__ import annotations

import asyncio

import pytest

from hetero_dp.kits.aiotools import cancel_and_wait, wait_event, with_timeout


async def test_cancel_in_the_turn_the_event_is_set_is_not_swallowed():
    """The restart race: one callback sets the event a task waits on and cancels it."""
    for _ in range(50):
        event = asyncio.Event()
        task = asyncio.ensure_future(wait_event(event, 10))
        await asyncio.sleep(0)  # the task is now waiting

        def both(event: asyncio.Event = event, task: asyncio.Future[bool] = task) -> None:
            event.set()
            task.cancel()

        asyncio.get_running_loop().call_soon(both)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()


async def test_wait_event_times_out_and_reports_set():
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, None) is True


async def test_with_timeout_leaves_a_condition_unlocked():
    cond = asyncio.Condition()
    async with cond:
        with pytest.raises(asyncio.TimeoutError):
            await with_timeout(cond.wait_for(lambda: False), 0.01)
        assert cond.locked()  # ours, still held, and nobody else's
    assert not cond.locked()
    async with cond:  # and it can be taken again
        pass


async def test_cancel_and_wait_names_what_did_not_end():
    stubborn_release = asyncio.Event()

    async def stubborn() -> None:
        while True:
            try:
                await stubborn_release.wait()
                return
            except asyncio.CancelledError:
                continue  # swallows it, as a task on 3.10/3.11 could

    polite = asyncio.ensure_future(asyncio.sleep(10))
    bad = asyncio.get_running_loop().create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    left = await cancel_and_wait([polite, bad], 0.05)
    assert left == ["stubborn"] and polite.cancelled()
    stubborn_release.set()
    await bad
