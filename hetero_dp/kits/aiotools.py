"""Waiting with a time limit without losing a cancellation.

``asyncio.wait_for`` on CPython 3.10 and 3.11 can swallow a cancellation that
arrives in the same loop turn as the inner awaitable's completion: the inner
result is returned and the cancelled task runs on (CPython bpo-42130 /
gh-86296; fixed by the rewrite on ``asyncio.timeout`` in 3.12, gh-96764; see
docs/sources.md#asyncio-wait-for). A supervisor that cancels such a
task and awaits it then waits forever. These helpers are built on
``asyncio.wait``, which never swallows the caller's cancellation, and are used
instead of ``wait_for`` throughout the core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; True if it is set.

    A cancellation of the caller always propagates, whatever else happens in the
    same loop turn.
    """
    if event.is_set():
        return True
    if timeout is not None and timeout <= 0:
        return False
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiter,), timeout=timeout)
    finally:
        if not waiter.done():
            waiter.cancel()
    return event.is_set()


async def with_timeout(aw: Awaitable[T], timeout: float | None) -> T:
    """Await ``aw`` for at most ``timeout`` seconds: its result, or TimeoutError.

    On a timeout (or when the caller is cancelled) the awaitable is cancelled and
    its end awaited before returning, as ``wait_for`` does: a coroutine that holds
    a lock or a condition re-acquires it while it unwinds, and must be done before
    the caller goes on. A thread behind a future is not stopped.
    """
    fut = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait((fut,), timeout=timeout)
    except asyncio.CancelledError:
        fut.cancel()
        await asyncio.wait((fut,))
        raise
    if not done:
        fut.cancel()
        await asyncio.wait((fut,))
        if not fut.cancelled() and fut.exception() is None:
            return fut.result()  # it finished as it was cancelled: keep the result
        raise asyncio.TimeoutError
    return fut.result()


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], timeout: float) -> list[str]:
    """Cancel ``tasks`` and wait at most ``timeout`` seconds for them to end.

    Returns the names of tasks still running then: the caller logs them and goes
    on, rather than waiting forever on a task that did not stop.
    """
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=timeout)
    for task in pending:  # retrieve what they ended with, so nothing is logged as lost
        if task.done() and not task.cancelled():
            task.exception()
    return [t.get_name() for t in pending if not t.done()]
