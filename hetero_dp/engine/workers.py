"""Worker threads for a backend's blocking hooks that survive calls never returning.

A hung driver call never returns (docs/sources.md#hung-calls): the thread running it is
gone for good. A fixed-size pool runs dry after a few such calls and every later
call of the backend queues behind them. Here a call the caller gave up on (its
timeout passed) is *stranded*: its thread no longer counts against the pool's
size, so a new thread takes its place and the rest of the backend keeps working.
When a stranded call does return, its thread rejoins the pool.

Stranded threads are capped: past ``max_stranded`` the pool refuses new calls
(:class:`PoolExhausted`) until some return, so a backend that hangs on every call
cannot grow the process without bound; the engine turns that into Unhealthy
devices with the reason.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class PoolExhausted(RuntimeError):
    """Too many calls of this pool are stuck to start another."""


class _Task:
    __slots__ = ("args", "fn", "future", "stranded")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.stranded = False


class WorkerPool:
    """Up to ``size`` threads running calls, plus up to ``max_stranded`` threads
    stuck in calls that were given up on. ``on_change()`` is called (from any
    thread) whenever the number of stranded calls changes."""

    def __init__(
        self,
        name: str,
        size: int,
        max_stranded: int,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.size = size
        self.max_stranded = max_stranded
        self.on_change = on_change
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[_Task] = deque()
        self._running: dict[concurrent.futures.Future[Any], _Task] = {}
        self._idle = 0  # threads waiting for work
        self._active = 0  # threads running a call that is not stranded
        self._stranded = 0
        self._threads = 0
        self._starting = 0  # threads started that have not taken a call yet
        self._closed = False

    @property
    def stranded(self) -> int:
        return self._stranded

    @property
    def exhausted(self) -> bool:
        return self._stranded >= self.max_stranded

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        task = _Task(fn, args)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"worker pool {self.name} is shut down")
            if self._stranded >= self.max_stranded:
                raise PoolExhausted(
                    f"{self._stranded} calls are stuck in the backend (at most "
                    f"{self.max_stranded} may be); refusing new calls until some return"
                )
            self._queue.append(task)
            self._dispatch()
        return task.future

    def strand(self, future: concurrent.futures.Future[Any]) -> None:
        """The caller gave up on ``future``: a queued call is dropped, a running one
        no longer counts against the pool's size (another thread may start)."""
        changed = False
        with self._lock:
            task = self._running.get(future)
            if task is None:
                for queued in self._queue:
                    if queued.future is future:
                        self._queue.remove(queued)
                        future.cancel()
                        break
                return
            if not task.stranded and not future.done():
                task.stranded = True
                self._active -= 1
                self._stranded += 1
                changed = True
                self._dispatch()
        if changed and self.on_change is not None:
            self.on_change()

    def warm(self) -> None:
        """Start one thread now, so the first call does not pay for starting it."""
        with self._lock:
            if self._closed or self._threads:
                return
            self._threads += 1
            self._starting += 1
            threading.Thread(target=self._work, name=f"{self.name}-1", daemon=True).start()

    def shutdown(self) -> None:
        """Drop queued calls and let idle threads end; stuck ones end when they return."""
        with self._lock:
            self._closed = True
            while self._queue:
                self._queue.popleft().future.cancel()
            self._wake.notify_all()

    # --- inside the lock -------------------------------------------------

    def _dispatch(self) -> None:
        if not self._queue:
            return
        if self._idle > 0:
            self._wake.notify()
            return
        if self._active + self._starting < self.size:
            self._threads += 1
            self._starting += 1
            threading.Thread(
                target=self._work, name=f"{self.name}-{self._threads}", daemon=True
            ).start()

    # --- worker threads --------------------------------------------------

    def _work(self) -> None:
        with self._lock:
            self._starting -= 1
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._idle += 1
                    self._wake.wait()
                    self._idle -= 1
                if not self._queue:  # closed
                    return
                if self._active >= self.size:
                    # more threads than the pool's size are free (stranded ones came
                    # back): this one ends, the others carry on
                    return
                task = self._queue.popleft()
                self._active += 1
                self._running[task.future] = task
            if task.future.set_running_or_notify_cancel():
                try:
                    task.future.set_result(task.fn(*task.args))
                except BaseException as e:
                    task.future.set_exception(e)
            changed = False
            with self._lock:
                del self._running[task.future]
                if task.stranded:
                    self._stranded -= 1
                    changed = True
                else:
                    self._active -= 1
            # An idle thread keeps nothing of its last call: a call given up on (its
            # caller gone) that returns a million devices late would stay in memory
            # through this variable until the thread's next call (issue #29).
            del task
            if changed and self.on_change is not None:
                self.on_change()
