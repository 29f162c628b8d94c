"""Running a backend's ``watch`` hook: in its own thread (a plain function) or as
a task (a coroutine), restarted with backoff when it raises, until the sink says
stop. Health events and rediscovery requests go through the :class:`EventSink`."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

from hetero_dp.engine.runtime import BackendRuntime

WATCH_RESTART_BACKOFF = (1.0, 60.0)


class HookWatch:
    """The watch hook of one backend. ``on_failed(rt, error)`` and
    ``on_restarted(rt)`` are called on the loop."""

    def __init__(
        self,
        rt: BackendRuntime,
        on_failed: Callable[[BackendRuntime, BaseException], None],
        on_restarted: Callable[[BackendRuntime], None],
    ) -> None:
        self.rt = rt
        self.on_failed = on_failed
        self.on_restarted = on_restarted

    def start(self) -> None:
        rt = self.rt
        sink = rt.sink
        assert sink is not None
        function = rt.backend.hook_function("watch")
        if function is None:
            return
        loop = asyncio.get_running_loop()
        if inspect.iscoroutinefunction(function):
            rt.watch_task = loop.create_task(
                self._run_async(function, sink), name=f"watch {rt.backend.name}"
            )
        else:
            t = threading.Thread(
                target=self._run_thread,
                args=(function, sink, loop),
                name=f"hdp-watch-{rt.backend.name}",
                daemon=True,
            )
            rt.watch_thread = t
            t.start()

    async def _run_async(self, watch: Any, sink: Any) -> None:
        delay = WATCH_RESTART_BACKOFF[0]
        while not sink.stopping.is_set():
            try:
                await watch(events=sink)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.on_failed(self.rt, e)
            await asyncio.sleep(delay)  # backoff before restarting a crashed watcher
            delay = min(delay * 2, WATCH_RESTART_BACKOFF[1])
            self.on_restarted(self.rt)

    def _run_thread(self, watch: Any, sink: Any, loop: asyncio.AbstractEventLoop) -> None:
        delay = WATCH_RESTART_BACKOFF[0]
        while not sink.stopping.is_set():
            try:
                watch(events=sink)
                return
            except Exception as e:
                if loop.is_closed():
                    return
                loop.call_soon_threadsafe(self.on_failed, self.rt, e)
            if sink.stopping.wait(delay):
                return
            delay = min(delay * 2, WATCH_RESTART_BACKOFF[1])
            if not loop.is_closed():
                loop.call_soon_threadsafe(self.on_restarted, self.rt)
