"""Finding backends and calling their hooks safely.

Backends are pluggy plugins: found by name through the entry-point group
``hetero_dp`` (bundled and third-party alike), or loaded from a ``.py`` file.
Each hook is called per backend, in a worker thread unless it is a coroutine,
under a timeout; an exception, a timeout or garbage becomes a
:class:`~hetero_dp.model.errors.BackendError` that the caller turns into Unhealthy
devices, never a dead daemon.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import inspect
import logging
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from hetero_dp import hookspecs
from hetero_dp.kits.aiotools import with_timeout
from hetero_dp.kits.entrypoints import entry_points
from hetero_dp.model.device import Check, Device, Link, Sample
from hetero_dp.model.errors import BackendError, ConfigError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hetero_dp"
# Hooks the kubelet is waiting on: they run in their own threads (see Backend).
REQUEST_HOOKS = frozenset({"allocate", "pre_start_container", "preferred_allocation"})


def available_backends() -> dict[str, str]:
    """Backends installed through the entry-point group: name -> module path."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _load_file(path: Path) -> ModuleType:
    name = f"hetero_dp_file_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load {path} as a Python module", field="backend")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ConfigError(f"importing {path} failed: {e!r}", field="backend") from e
    return module


def resolve(spec: str | ModuleType | object) -> tuple[str, object]:
    """A backend given by entry-point name, ``.py`` path or object -> (name, plugin)."""
    if not isinstance(spec, str):
        name = (
            getattr(spec, "hetero_dp_name", None)
            or getattr(spec, "__name__", type(spec).__name__).rsplit(".", 1)[-1]
        )
        return name, spec
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"no such plugin file: {spec}", field="backend")
        return path.stem, _load_file(path.resolve())
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == spec:
            try:
                return spec, ep.load()
            except Exception as e:
                raise ConfigError(f"loading backend {spec!r} failed: {e!r}", field="backend") from e
    known = ", ".join(sorted(available_backends())) or "none installed"
    raise ConfigError(
        f"unknown backend {spec!r} (installed: {known}; or give a path to a .py file)",
        field="backend",
    )


def new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("hetero_dp")
    pm.add_hookspecs(hookspecs)
    return pm


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
        self.options: Mapping[str, Any] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=4, thread_name_prefix=f"hdp-{name}"
        )
        # The kubelet waits on these: a pool of their own, so health checks or a
        # discovery hanging in the backend cannot queue an Allocate behind them.
        self._request_executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix=f"hdp-{name}-req"
        )
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

    async def call(self, hook: str, *, timeout: float | None = None, **kwargs: Any) -> Any:
        """Call one hook of this backend; BackendError on raise, timeout or coroutine misuse."""
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
            loop = asyncio.get_running_loop()
            pool = self._request_executor if hook in REQUEST_HOOKS else self._executor
            fut = loop.run_in_executor(pool, self._call_sync, hook, kwargs)
            return await with_timeout(fut, limit)
        except asyncio.TimeoutError as e:
            raise BackendError(
                f"backend {self.name!r} hook {hook} timed out after {limit:g}s"
            ) from e
        except (asyncio.CancelledError, BackendError):
            raise
        except Exception as e:
            if hook in ("allocate", "configure") and isinstance(e, ConfigError | ValueError):
                raise
            raise BackendError(f"backend {self.name!r} hook {hook} raised {e!r}") from e

    # Typed wrappers: each checks the shape of what the backend returned.

    async def configure(self, options: Mapping[str, Any]) -> None:
        """Run the configure hook; a refusal (ConfigError, ValueError) or a failure is a
        ConfigError naming this backend (unless it names its own source)."""
        try:
            await self.call("configure", options=options)
        except ConfigError as e:
            source = e.source or f"backend {self.name}"
            raise ConfigError(e.reason, field=e.field, source=source) from None
        except (ValueError, BackendError) as e:
            raise ConfigError(str(e), source=f"backend {self.name}") from None

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

    async def check_health(self, device: Device) -> tuple[bool, str]:
        result = await self.call("check_health", device=device)
        if result is None or result is True:
            return True, ""
        if result is False:
            return False, "health check failed"
        if isinstance(result, str):
            return False, result
        if isinstance(result, tuple) and len(result) == 2:
            return bool(result[0]), str(result[1])
        raise BackendError(
            f"backend {self.name!r} check_health returned {result!r}; "
            "expected True/None, False or a reason string"
        )

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
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._request_executor.shutdown(wait=False, cancel_futures=True)


def load_backends(
    specs: Iterable[str | ModuleType | object], *, timeout: float = 10.0
) -> list[Backend]:
    """Load and register each backend; ConfigError for unknown names or bad files."""
    pm = new_manager()
    backends = []
    names: set[str] = set()
    for spec in specs:
        name, plugin = resolve(spec)
        if name in names:
            raise ConfigError(f"backend {name!r} given twice", field="backend")
        names.add(name)
        try:
            pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as e:
            raise ConfigError(
                f"backend {name!r} is not a valid plugin: {e}", field="backend"
            ) from e
        backends.append(Backend(name, plugin, pm, timeout=timeout))
    return backends
