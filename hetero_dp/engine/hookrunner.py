"""Running one backend's hooks safely: threads, timeouts, containment.

How each hook is called is its row in :data:`hetero_dp.hookspecs.POLICY`, read
here and nowhere else: the threads a plain hook runs in, its timeout, the errors
that pass through as raised and the check of its result (:mod:`.results`). A hook
declared ``async def`` (or an async generator) runs on the event loop with no
thread hop. Either way it runs under its timeout, and an exception, a timeout or a
call into a pool whose threads are all stuck becomes a
:class:`~hetero_dp.model.errors.BackendError`. Options are bound by :mod:`.binding`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import os
import time
import traceback
import types
from collections.abc import Callable, Coroutine, Generator, Mapping
from typing import Any

import pluggy

from hetero_dp.engine.results import CHECKS
from hetero_dp.engine.workers import PoolExhausted, WorkerPool
from hetero_dp.hookspecs import POLICY, HookPolicy
from hetero_dp.kits.aiotools import with_timeout
from hetero_dp.model.errors import BackendError

log = logging.getLogger("hetero_dp.engine.backend")
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hetero_dp/
# the standard library's dir: where os.py is, as sysconfig.get_paths()["stdlib"] says
# (sysconfig itself loads the build's config data: ~1 ms of every start, issue 35)
_STDLIB = os.path.dirname(os.path.abspath(os.__file__))

# the check of each hook's result, from its row
RESULT_CHECKS = {h: CHECKS[p.result] for h, p in POLICY.items() if p.result in CHECKS}
WORKERS = 4  # threads for a backend's other blocking hooks (health, discovery...)
REQUEST_WORKERS = 2
# Calls given up on (past hookTimeout) whose threads may stay stuck, per pool; past
# this the backend counts as broken (all its devices Unhealthy) until some return.
MAX_STUCK_CALLS = 8


def hook_impls(plugin: object, pm: pluggy.PluginManager) -> dict[str, pluggy.HookImpl]:
    """``plugin``'s implementation of each hook it implements, by hook name."""
    out: dict[str, pluggy.HookImpl] = {}
    for hook_name in dir(pm.hook):
        if hook_name.startswith("_"):
            continue
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            if impl.plugin is plugin:
                out[hook_name] = impl
    return out


def runs_on_loop(function: Any) -> bool:
    """Whether a hook function runs on the event loop (``async def``, async generator)."""
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], first: Any) -> Generator[Any, Any, Any]:
    """Go on with ``coro`` after its first step (which yielded ``first``), exactly as
    ``await coro`` would have: what the loop sends or throws in goes to ``coro``."""
    value = first
    while True:
        try:
            sent = yield value
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:
            try:
                value = coro.throw(e)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                value = coro.send(sent)
            except StopIteration as stop:
                return stop.value


async def _rest(coro: Coroutine[Any, Any, Any], first: Any) -> Any:
    return await _resume(coro, first)


async def run_eagerly(coro: Coroutine[Any, Any, Any], limit: float) -> Any:
    """``await coro`` under ``limit`` seconds, its first step run at once: a hook that
    finishes without waiting on anything (an Allocate that only edits the response)
    returns with no task, no timer and no loop turn; one that waits goes on under the
    timeout as a task, as before. The first step, like any code on the loop, cannot
    be interrupted: an ``async def`` hook must not block."""
    try:
        first = coro.send(None)
    except StopIteration as stop:
        return stop.value
    return await with_timeout(_rest(coro, first), limit)


def _author_dir(function: Any) -> tuple[str, bool]:
    """The file that defines ``function`` and whether its whole package counts as the
    author's (a plugin package: the dir holding its ``__init__.py``)."""
    try:
        path = os.path.abspath(inspect.getsourcefile(inspect.unwrap(function)) or "")
    except TypeError:
        return "", False
    here = os.path.dirname(path)
    if os.path.isfile(os.path.join(here, "__init__.py")):
        return here + os.sep, True
    return path, False


def raised_at(e: BaseException, function: Any) -> str:
    """``file:line`` in the author's code where ``e`` was raised: the innermost frame in
    the hook's file (or its plugin package), so a call into a library names the author's
    line that made it; else the innermost frame outside hetero-dp and the standard
    library; '' when the traceback has neither."""
    frames = traceback.extract_tb(e.__traceback__)
    mine, package = _author_dir(function)
    if mine:
        for frame in reversed(frames):
            path = os.path.abspath(frame.filename)
            if path.startswith(mine) if package else path == mine:
                return f"{frame.filename}:{frame.lineno}"
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if not path.startswith((_OURS + os.sep, _STDLIB + os.sep)):
            return f"{frame.filename}:{frame.lineno}"
    return ""


def hook_raised(name: str, hook: str, e: BaseException, function: Any) -> BackendError:
    """The BackendError for a hook that raised: what, and where in the author's code
    (the traceback at debug level)."""
    where = raised_at(e, function)
    log.debug("backend %r hook %s raised %r", name, hook, e, exc_info=e)
    at = f" at {where}" if where else ""
    error = BackendError(f"backend {name!r} hook {hook} raised {e!r}{at}")
    error.__cause__ = e
    return error


def defined_at(function: Any) -> str:
    """``file:line`` where a hook function is defined, '' if unknown."""
    try:
        target = inspect.unwrap(function)
        return f"{inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    except (OSError, TypeError):
        return ""


def hook_timed_out(name: str, hook: str, limit: float, function: Any, key: str = "") -> str:
    """What a hook that passed its timeout is said with: nothing raised, so the place
    named is where the hook is defined."""
    where = defined_at(function)
    at = f" (hook {hook} defined at {where})" if where else ""
    on = f" for {key}" if key else ""
    return f"backend {name!r} hook {hook}{on} timed out after {limit:g}s{at}"


class HookRunner:
    """Safe calls of one backend's hooks: the worker pools, the timeout, the calls
    given up on (stuck) and the errors a caller can rely on."""

    def __init__(
        self, name: str, impls: Mapping[str, pluggy.HookImpl], *, timeout: float = 10.0
    ) -> None:
        self.name = name
        self.timeout = timeout
        self._impls = dict(impls)
        self._policy: dict[str, HookPolicy] = {h: POLICY[h] for h in self._impls}
        # the hooks declared ``async def`` (inspect per call was a tenth of an Allocate)
        self._coroutines = frozenset(
            h for h, impl in self._impls.items() if inspect.iscoroutinefunction(impl.function)
        )
        # Called (from any thread) when the number of stuck calls changes, and with
        # (hook, key) when a call that was given up on finally returns.
        self.on_stuck_change: Callable[[], None] | None = None
        self.on_returned: Callable[[str, str], None] | None = None
        self.pool = WorkerPool(f"hdp-{name}", WORKERS, MAX_STUCK_CALLS, self._stuck_changed)
        # The kubelet waits on these: a pool of their own, so health checks or a
        # discovery hanging in the backend cannot queue an Allocate behind them.
        self.request_pool = WorkerPool(
            f"hdp-{name}-req", REQUEST_WORKERS, MAX_STUCK_CALLS, self._stuck_changed
        )
        # (hook, key) -> (the call still running after its caller gave up, since when)
        self._stuck: dict[tuple[str, str], tuple[concurrent.futures.Future[Any], float]] = {}

    def implements(self, hook: str) -> bool:
        return hook in self._impls

    def hook_function(self, hook: str) -> Any:
        """The backend's own function for ``hook`` (None if it has none)."""
        impl = self._impls.get(hook)
        return None if impl is None else impl.function

    def call_sync(self, hook: str, kwargs: Mapping[str, Any]) -> Any:
        """Call ``hook`` here and now (in a worker thread, or before any loop runs)."""
        impl = self._impls[hook]
        result = impl.function(**{k: kwargs[k] for k in impl.argnames})
        if inspect.isgenerator(result):  # discover may yield
            result = list(result)
        return result

    def warm(self) -> None:
        """Start the thread of the kubelet's hooks now (when the backend runs any of
        them in threads), so the first Allocate does not pay for starting it."""
        if any(
            p.runs == "request" and not runs_on_loop(self._impls[h].function)
            for h, p in self._policy.items()
        ):
            self.request_pool.warm()

    def _stuck_changed(self) -> None:
        if self.on_stuck_change is not None:
            self.on_stuck_change()

    @property
    def stuck_reason(self) -> str:
        """Why the whole backend counts as broken ('' when it does not): too many of
        its calls never returned."""
        pools = (self.pool, self.request_pool)
        if not any(p.exhausted for p in pools):
            return ""
        stuck = sum(p.stranded for p in pools)
        return (
            f"backend {self.name!r}: {stuck} hook calls are stuck in the backend and never "
            f"returned (at most {MAX_STUCK_CALLS} per pool); new calls are refused until "
            "they return"
        )

    def still_stuck(self, hook: str, key: str, limit: float) -> BackendError | None:
        """The error for calling ``hook`` for ``key`` while an earlier call is stuck."""
        entry = self._stuck.get((hook, key))
        if entry is None:
            return None
        where = defined_at(self.hook_function(hook))
        return BackendError(
            f"backend {self.name!r} hook {hook} for {key} has not returned for "
            f"{time.monotonic() - entry[1]:.0f}s (stuck; hookTimeout is {limit:g}s); "
            "not called again until it returns" + (f" (defined at {where})" if where else "")
        )

    def give_up(
        self,
        pool: WorkerPool,
        cf: concurrent.futures.Future[Any],
        hook: str,
        key: str | None,
        started: float,
    ) -> None:
        """Give up on a call past its timeout: its thread is replaced, and with ``key``
        the hook is not called for that key again until the call returns."""
        pool.strand(cf)
        if key is not None:
            self._stuck[(hook, key)] = (cf, started)
            cf.add_done_callback(lambda _f: self._returned(hook, key, cf))

    def _returned(self, hook: str, key: str, cf: concurrent.futures.Future[Any]) -> None:
        """A stuck call finally returned (in its worker thread)."""
        entry = self._stuck.get((hook, key))
        if entry is not None and entry[0] is cf:
            del self._stuck[(hook, key)]
            if self.on_returned is not None:
                self.on_returned(hook, key)

    def checked(self, hook: str, result: Any) -> Any:
        """``result`` through the check of ``hook``'s row (as it is if the row has
        none); a BackendError for a wrong shape names the hook's file and line."""
        check = RESULT_CHECKS.get(hook)
        if check is None:
            return result
        try:
            return check(self.name, hook, result)
        except BackendError as e:
            where = defined_at(self.hook_function(hook))
            if not where:
                raise
            raise BackendError(f"{e} (hook {hook} defined at {where})") from None

    def limit(self, hook: str) -> float:
        """``hook``'s timeout in seconds: its row's, or the ``hookTimeout`` setting."""
        timeout = POLICY[hook].timeout
        return timeout if isinstance(timeout, int | float) else self.timeout

    async def _in_thread(self, hook: str, key: str | None, limit: float, kwargs: Any) -> Any:
        pool = self.request_pool if self._policy[hook].runs == "request" else self.pool
        if key is not None and (stuck := self.still_stuck(hook, key, limit)) is not None:
            raise stuck
        try:
            cf = pool.submit(self.call_sync, hook, kwargs)
        except PoolExhausted as e:
            raise BackendError(f"backend {self.name!r} hook {hook} not called: {e}") from None
        started = time.monotonic()
        try:
            return await with_timeout(asyncio.wrap_future(cf), limit)
        except asyncio.TimeoutError:
            self.give_up(pool, cf, hook, key, started)
            raise

    async def call(
        self, hook: str, *, timeout: float | None = None, key: str | None = None, **kwargs: Any
    ) -> Any:
        """Call one hook as its row says; BackendError on raise, timeout or a stuck call.

        An ``async def`` hook runs on the loop with no thread hop; a blocking hook
        runs in the threads its row names, and when it passes its timeout (the row's,
        or ``timeout`` given here) the call is given up on and its thread replaced
        (see :mod:`.workers`). With ``key`` (a device ID, a claim's UID), a call still
        stuck for that key is not started again: the BackendError says since when it
        is stuck. What the row's ``passes`` names passes through as raised. The
        result goes through the row's check (:meth:`checked`); a hook the backend
        does not implement answers as if it returned None.
        """
        impl = self._impls.get(hook)
        if impl is None:
            return self.checked(hook, None)
        function: Any = impl.function
        limit = self.limit(hook) if timeout is None else timeout
        try:
            if hook in self._coroutines:
                argnames = impl.argnames
                # all the arguments given (the kubelet's hooks): no dict to filter them
                args = kwargs if len(argnames) == len(kwargs) else {k: kwargs[k] for k in argnames}
                result = await run_eagerly(function(**args), limit)
            elif inspect.isasyncgenfunction(function):
                args = {k: kwargs[k] for k in impl.argnames}

                async def collect() -> list[Any]:
                    return [x async for x in function(**args)]

                result = await with_timeout(collect(), limit)
            else:
                result = await self._in_thread(hook, key, limit, kwargs)
        except asyncio.TimeoutError as e:
            raise BackendError(hook_timed_out(self.name, hook, limit, function, key or "")) from e
        except (asyncio.CancelledError, BackendError):
            raise
        except Exception as e:
            if isinstance(e, self._policy[hook].passes):  # a documented refusal
                raise
            raise hook_raised(self.name, hook, e, function) from e
        return result if hook not in RESULT_CHECKS else self.checked(hook, result)

    def close(self) -> None:
        self.pool.shutdown()
        self.request_pool.shutdown()
