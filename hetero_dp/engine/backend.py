"""Calling one backend's hooks safely.

Each hook is called per backend, in a worker thread unless it is a coroutine,
under a timeout; an exception, a timeout or garbage becomes a
:class:`~hetero_dp.model.errors.BackendError` that the caller turns into Unhealthy
devices, never a dead daemon. Finding and loading backends is
:mod:`hetero_dp.engine.loading`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from hetero_dp.engine.workers import PoolExhausted, WorkerPool
from hetero_dp.kits.aiotools import with_timeout
from hetero_dp.model.device import Check, Device, Link, Sample
from hetero_dp.model.errors import AllocationError, BackendError, ConfigError
from hetero_dp.model.options import parse_options, schema_of

if TYPE_CHECKING:
    from hetero_dp.engine.config import Config

log = logging.getLogger(__name__)

# Hooks the kubelet is waiting on: they run in their own threads (see Backend).
REQUEST_HOOKS = frozenset({"allocate", "pre_start_container", "preferred_allocation"})
WORKERS = 4  # threads for a backend's other blocking hooks (health, discovery...)
REQUEST_WORKERS = 2
# Calls given up on (past hookTimeout) whose threads may stay stuck, per pool; past
# this the backend counts as broken (all its devices Unhealthy) until some return.
MAX_STUCK_CALLS = 8
HEALTH_CHUNK = 256  # devices per worker call in a health poll
HEALTH_YIELD_EVERY = 8


class _HealthBatch:
    """Devices one worker call checks in turn; ``current`` is (index, start time) of
    the device at hand, set by the worker (one assignment, read by the loop)."""

    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices
        self.current: tuple[int, float] | None = None
        self.results: dict[str, tuple[bool, str] | BackendError] = {}
        self.abandoned = False


class Backend:
    """One loaded backend and safe, per-backend calls of its hooks."""

    def __init__(
        self,
        name: str,
        plugin: object,
        pm: pluggy.PluginManager,
        *,
        timeout: float = 10.0,
    ) -> None:
        self.name = name
        self.plugin = plugin
        self.pm = pm
        self.timeout = timeout
        # what the hooks get as ``options``: the declared options dataclass's
        # instance, or the mapping as given to a backend that declares none
        self.options: Any = {}
        # Called (from any thread) when the number of stuck calls changes, and with
        # (hook, key) when a call that was given up on finally returns; the engine
        # sets them to re-judge the backend and the device.
        self.on_stuck_change: Callable[[], None] | None = None
        self.on_returned: Callable[[str, str], None] | None = None
        self._pool = WorkerPool(
            f"hdp-{name}", WORKERS, MAX_STUCK_CALLS, lambda: self._stuck_changed()
        )
        # The kubelet waits on these: a pool of their own, so health checks or a
        # discovery hanging in the backend cannot queue an Allocate behind them.
        self._request_pool = WorkerPool(
            f"hdp-{name}-req", REQUEST_WORKERS, MAX_STUCK_CALLS, lambda: self._stuck_changed()
        )
        # (hook, key) -> (the call still running after its caller gave up, since when)
        self._stuck: dict[tuple[str, str], tuple[concurrent.futures.Future[Any], float]] = {}
        self._impls: dict[str, pluggy.HookImpl] = {}
        for hook_name in dir(pm.hook):
            if hook_name.startswith("_"):
                continue
            caller = getattr(pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    self._impls[hook_name] = impl
        if "discover" not in self._impls:
            raise ConfigError(f"backend {name!r} implements no 'discover' hook", field="backend")
        self.schema = schema_of(self.hook_function("configure"))

    def implements(self, hook: str) -> bool:
        return hook in self._impls

    def hook_function(self, hook: str) -> Any:
        """The backend's own function for ``hook`` (None if it has none), for hooks
        the engine runs itself rather than through :meth:`call` (``watch``)."""
        impl = self._impls.get(hook)
        return None if impl is None else impl.function

    def _call_sync(self, hook: str, kwargs: Mapping[str, Any]) -> Any:
        impl = self._impls[hook]
        args = {k: kwargs[k] for k in impl.argnames}
        result = impl.function(**args)
        if inspect.isgenerator(result):  # discover may yield
            result = list(result)
        return result

    def warm(self) -> None:
        """Start the thread of the kubelet's hooks now (when the backend has any of
        them), so the first Allocate does not pay for starting it."""
        if any(h in self._impls for h in REQUEST_HOOKS):
            self._request_pool.warm()

    def _stuck_changed(self) -> None:
        if self.on_stuck_change is not None:
            self.on_stuck_change()

    @property
    def stuck_reason(self) -> str:
        """Why the whole backend counts as broken ('' when it does not): too many of
        its calls never returned."""
        pools = [p for p in (self._pool, self._request_pool) if p.exhausted]
        if not pools:
            return ""
        stuck = sum(p.stranded for p in (self._pool, self._request_pool))
        return (
            f"backend {self.name!r}: {stuck} hook calls are stuck in the backend and never "
            f"returned (at most {MAX_STUCK_CALLS} per pool); new calls are refused until "
            "they return"
        )

    def _still_stuck(self, hook: str, key: str, limit: float) -> BackendError | None:
        """The error for calling ``hook`` for ``key`` while an earlier call is stuck."""
        entry = self._stuck.get((hook, key))
        if entry is None:
            return None
        return BackendError(
            f"backend {self.name!r} hook {hook} for {key} has not returned for "
            f"{time.monotonic() - entry[1]:.0f}s (stuck; hookTimeout is {limit:g}s); "
            "not called again until it returns"
        )

    async def _in_thread(self, hook: str, key: str | None, limit: float, kwargs: Any) -> Any:
        pool = self._request_pool if hook in REQUEST_HOOKS else self._pool
        if key is not None and (stuck := self._still_stuck(hook, key, limit)) is not None:
            raise stuck
        try:
            cf = pool.submit(self._call_sync, hook, kwargs)
        except PoolExhausted as e:
            raise BackendError(f"backend {self.name!r} hook {hook} not called: {e}") from None
        started = time.monotonic()
        try:
            return await with_timeout(asyncio.wrap_future(cf), limit)
        except asyncio.TimeoutError:
            pool.strand(cf)
            if key is not None:
                self._stuck[(hook, key)] = (cf, started)
                cf.add_done_callback(lambda _f: self._returned(hook, key, cf))
            raise

    def _returned(self, hook: str, key: str, cf: concurrent.futures.Future[Any]) -> None:
        """A stuck call finally returned (in its worker thread)."""
        entry = self._stuck.get((hook, key))
        if entry is not None and entry[0] is cf:
            del self._stuck[(hook, key)]
            if self.on_returned is not None:
                self.on_returned(hook, key)

    async def call(
        self, hook: str, *, timeout: float | None = None, key: str | None = None, **kwargs: Any
    ) -> Any:
        """Call one hook of this backend; BackendError on raise, timeout or coroutine misuse.

        A blocking hook runs in a worker thread; when it passes its timeout the call
        is given up on and its thread replaced (see :mod:`.workers`). With ``key``
        (a device ID), a call still stuck for that key is not started again: the
        BackendError says since when it is stuck.
        """
        impl = self._impls.get(hook)
        if impl is None:
            return None
        function: Any = impl.function
        limit = self.timeout if timeout is None else timeout
        try:
            if inspect.iscoroutinefunction(impl.function) or inspect.isasyncgenfunction(
                impl.function
            ):
                args = {k: kwargs[k] for k in impl.argnames}
                if inspect.isasyncgenfunction(impl.function):

                    async def collect() -> list[Any]:
                        return [x async for x in function(**args)]

                    return await with_timeout(collect(), limit)
                return await with_timeout(function(**args), limit)
            return await self._in_thread(hook, key, limit, kwargs)
        except asyncio.TimeoutError as e:
            raise BackendError(
                f"backend {self.name!r} hook {hook} timed out after {limit:g}s"
            ) from e
        except (asyncio.CancelledError, BackendError):
            raise
        except AllocationError as e:
            if hook in REQUEST_HOOKS:  # a documented refusal: its own code and message
                raise
            raise BackendError(f"backend {self.name!r} hook {hook} raised {e!r}") from e
        except Exception as e:
            if hook in ("allocate", "configure") and isinstance(e, ConfigError | ValueError):
                raise
            raise BackendError(f"backend {self.name!r} hook {hook} raised {e!r}") from e

    # Typed wrappers: each checks the shape of what the backend returned.

    def read_options(
        self,
        options: Mapping[str, Any],
        *,
        source: str = "",
        flagged: frozenset[str] = frozenset(),
    ) -> Any:
        """What the hooks get as ``options``: an instance of the options dataclass
        that ``configure`` declares (checked: ConfigError naming the option), or the
        mapping as given. Options for a backend with no ``configure`` hook are refused:
        nothing would read them."""
        field = f"backends.{self.name}"
        if self.schema is not None:
            return parse_options(
                self.schema, options, field=field, source=source or "config", flagged=flagged
            )
        if options and not self.implements("configure"):
            raise ConfigError(
                f"unknown option: backend {self.name!r} takes no options (it has no "
                "configure hook)",
                field=f"{field}.{next(iter(options))}",
                source=source or "config",
            )
        return options

    async def configure(
        self,
        options: Mapping[str, Any],
        *,
        source: str = "",
        flagged: frozenset[str] = frozenset(),
    ) -> None:
        """Check ``options`` (:meth:`read_options`) and run the configure hook; a
        refusal (ConfigError, ValueError) or a failure is a ConfigError naming this
        backend (unless it names its own source)."""
        await self._configure(self.read_options(options, source=source, flagged=flagged))

    async def configure_from(self, cfg: Config) -> None:
        """:meth:`configure` with this backend's options from ``cfg`` (the file, the
        environment and ``-o`` flags)."""
        await self._configure(self.read_options_from(cfg))

    def read_options_from(self, cfg: Config) -> Any:
        """:meth:`read_options` with this backend's options from ``cfg``; a refusal
        names the option where the user wrote it."""
        try:
            return self.read_options(
                cfg.backend_options(self.name),
                source=cfg.options_source(self.name),
                flagged=cfg.backend_flagged.get(self.name, frozenset()),
            )
        except ConfigError as e:
            where = cfg.option_field(self.name, e.field or "")
            if where == e.field:
                raise
            raise ConfigError(e.reason, field=where, source=e.source) from None

    async def _configure(self, value: Any) -> None:
        try:
            await self.call("configure", options=value)
        except ConfigError as e:
            source = e.source or f"backend {self.name}"
            raise ConfigError(e.reason, field=e.field, source=source) from None
        except (ValueError, BackendError) as e:
            raise ConfigError(str(e), source=f"backend {self.name}") from None
        self.options = value

    async def discover(self) -> list[Device]:
        result = await self.call("discover")
        if result is None:
            return []
        if not isinstance(result, Iterable):
            raise BackendError(f"backend {self.name!r} discover returned {type(result).__name__}")
        devices = list(result)
        bad = [d for d in devices if not isinstance(d, Device)]
        if bad:
            raise BackendError(
                f"backend {self.name!r} discover returned non-Device items: {bad[:3]!r}"
            )
        dupes = sorted(i for i, n in Counter(d.id for d in devices).items() if n > 1)
        if dupes:
            raise BackendError(f"backend {self.name!r} discover returned duplicate IDs: {dupes}")
        return devices

    def health_verdict(self, result: Any) -> tuple[bool, str]:
        """A check_health result as (healthy, reason); BackendError for garbage."""
        if result is None or result is True:
            return True, ""
        if result is False:
            return False, "health check failed"
        if isinstance(result, str):
            return False, result
        if isinstance(result, tuple) and len(result) == 2:
            why = result[1]
            return bool(result[0]), why if isinstance(why, str) else str(why)
        raise BackendError(
            f"backend {self.name!r} check_health returned {result!r}; "
            "expected True/None, False or a reason string"
        )

    async def check_health(self, device: Device) -> tuple[bool, str]:
        result = await self.call("check_health", key=device.id, device=device)
        return self.health_verdict(result)

    async def check_health_many(
        self, devices: list[Device], on_error: Callable[[BackendError], None] | None = None
    ) -> dict[str, tuple[bool, str]]:
        """check_health over ``devices``: a verdict per device ID (a failure, a timeout
        or a call still stuck is an Unhealthy verdict naming the hook and the limit).

        A blocking hook runs over chunks of devices, one worker call per chunk (the
        event loop handles a few dozen futures for 10,000 devices, not 10,000);
        each device is still under the timeout: when one hangs, it alone is judged
        stuck, its thread is given up on, and the rest of its chunk goes on in
        another thread.
        """
        impl = self._impls.get("check_health")
        if impl is None or not devices:
            return {}
        out: dict[str, tuple[bool, str]] = {}

        def failed(device_id: str, e: BackendError) -> None:
            if on_error is not None:
                on_error(e)
            out[device_id] = (False, str(e))

        if inspect.iscoroutinefunction(impl.function):

            async def one(d: Device) -> None:
                try:
                    out[d.id] = await self.check_health(d)
                except BackendError as e:
                    failed(d.id, e)

            await asyncio.gather(*(one(d) for d in devices))
            return out
        limit = self.timeout
        todo = []
        for d in devices:
            if (stuck := self._still_stuck("check_health", d.id, limit)) is not None:
                failed(d.id, stuck)
            else:
                todo.append(d)
        size = max(1, min(HEALTH_CHUNK, -(-len(todo) // WORKERS)))
        chunks = [todo[i : i + size] for i in range(0, len(todo), size)]
        await asyncio.gather(*(self._check_chunk(c, limit, out, failed) for c in chunks))
        return out

    async def _check_chunk(
        self,
        devices: list[Device],
        limit: float,
        out: dict[str, tuple[bool, str]],
        failed: Callable[[str, BackendError], None],
    ) -> None:
        while devices:
            batch = _HealthBatch(devices)
            try:
                cf = self._pool.submit(self._run_health_batch, batch)
            except PoolExhausted as e:
                for d in devices:
                    failed(d.id, BackendError(f"backend {self.name!r} hook check_health: {e}"))
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
                stuck = batch.devices[index]
                batch.abandoned = True
                self._pool.strand(cf)
                key = stuck.id
                self._stuck[("check_health", key)] = (cf, started)
                cf.add_done_callback(self._on_batch_returned(key, cf))
                failed(
                    key,
                    BackendError(
                        f"backend {self.name!r} hook check_health for {key} timed out "
                        f"after {limit:g}s"
                    ),
                )
                devices = batch.devices[index + 1 :]  # the rest go on in another thread
                break
            for device_id, verdict in list(batch.results.items()):
                if isinstance(verdict, BackendError):
                    failed(device_id, verdict)
                else:
                    out[device_id] = verdict

    def _on_batch_returned(
        self, key: str, cf: concurrent.futures.Future[Any]
    ) -> Callable[[concurrent.futures.Future[Any]], None]:
        return lambda _f: self._returned("check_health", key, cf)

    def _run_health_batch(self, batch: _HealthBatch) -> None:
        """In a worker thread: check each device in turn, saying which one is at hand."""
        function: Any = self._impls["check_health"].function
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
                verdict: tuple[bool, str] | BackendError = self.health_verdict(function(device=d))
            except BackendError as e:
                verdict = e
            except Exception as e:
                verdict = BackendError(f"backend {self.name!r} hook check_health raised {e!r}")
            if batch.abandoned:  # this call came back after it was given up on
                return
            batch.results[d.id] = verdict

    async def links(self, devices: list[Device]) -> list[Link]:
        result = await self.call("links", devices=devices)
        links = list(result or [])
        if any(not isinstance(x, Link) for x in links):
            raise BackendError(f"backend {self.name!r} links returned non-Link items")
        return links

    async def labels(self, devices: list[Device]) -> dict[str, str]:
        result = await self.call("labels", devices=devices)
        if result is None:
            return {}
        if not isinstance(result, Mapping):
            raise BackendError(f"backend {self.name!r} labels returned {type(result).__name__}")
        return {str(k): str(v) for k, v in result.items()}

    async def metrics(self, devices: list[Device]) -> list[Sample]:
        result = await self.call("metrics", devices=devices)
        samples = list(result or [])
        if any(not isinstance(x, Sample) for x in samples):
            raise BackendError(f"backend {self.name!r} metrics returned non-Sample items")
        return samples

    async def doctor(self, options: Mapping[str, Any]) -> list[Check]:
        result = await self.call("doctor", options=options)
        return [c for c in (result or []) if isinstance(c, Check)]

    async def resource_defaults(self, resource: str) -> dict[str, Any]:
        result = await self.call("resource_defaults", resource=resource)
        return dict(result or {})

    def parse_args(self, args: list[str]) -> dict[str, Any]:
        """Run the ``parse_args`` hook (synchronously: before any loop starts).

        A refusal (ConfigError, ValueError) or a failure is a ConfigError naming this
        backend (unless it names its own source).
        """
        try:
            result = self._call_sync("parse_args", {"args": list(args)})
        except ConfigError as e:
            source = e.source or f"backend {self.name}"
            raise ConfigError(e.reason, field=e.field, source=source) from None
        except Exception as e:
            raise ConfigError(
                f"backend {self.name!r} hook parse_args raised {e!r}", source="command line"
            ) from None
        if result is None:
            return {}
        if not isinstance(result, Mapping):
            raise ConfigError(
                f"backend {self.name!r} parse_args returned {type(result).__name__}",
                source="command line",
            )
        return dict(result)

    async def cdi_spec_edits(self, kind: str, devices: list[Device]) -> dict[str, Any]:
        result = await self.call("cdi_spec_edits", kind=kind, devices=devices)
        if result is None:
            return {}
        if not isinstance(result, Mapping):
            raise BackendError(
                f"backend {self.name!r} cdi_spec_edits returned {type(result).__name__}"
            )
        return dict(result)

    def close(self) -> None:
        self._pool.shutdown()
        self._request_pool.shutdown()
