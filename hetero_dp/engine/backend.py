"""One loaded backend: its hooks, called safely, their results checked.

The three jobs live in their own modules, each usable without a daemon:
:mod:`.hookrunner` runs hooks (threads, timeouts, containment; ``async def`` hooks
on the loop), :mod:`.results` checks what they return, :mod:`.binding` binds the
options ``configure`` declares; :mod:`.healthcalls` runs ``check_health`` over many
devices. :class:`Backend` puts them together for the engine. Finding and loading
backends is :mod:`hetero_dp.engine.loading`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

from hetero_dp.engine import results
from hetero_dp.engine.binding import OptionBinder, configure_error, placed
from hetero_dp.engine.healthcalls import check_health_many
from hetero_dp.engine.hookrunner import REQUEST_HOOKS, HookRunner, defined_at, hook_impls
from hetero_dp.model.device import Check, Device, Link, Sample
from hetero_dp.model.errors import BackendError, ConfigError, StartError

if TYPE_CHECKING:
    from hetero_dp.engine.config import Config

__all__ = ["REQUEST_HOOKS", "Backend"]

_T = TypeVar("_T")


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
        impls = hook_impls(plugin, pm)
        if "discover" not in impls:
            raise ConfigError(f"backend {name!r} implements no 'discover' hook", field="backend")
        self.runner = HookRunner(name, impls, timeout=timeout)
        self.binder = OptionBinder(name, self.runner.hook_function("configure"))
        self.schema = self.binder.schema
        # what the hooks get as ``options``: the declared options dataclass's
        # instance, or the mapping as given to a backend that declares none
        self.options: Any = {}

    # -- running hooks (HookRunner) ---------------------------------------------

    @property
    def timeout(self) -> float:
        return self.runner.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.runner.timeout = value

    @property
    def on_stuck_change(self) -> Callable[[], None] | None:
        """Called (from any thread) when the number of stuck calls changes."""
        return self.runner.on_stuck_change

    @on_stuck_change.setter
    def on_stuck_change(self, callback: Callable[[], None] | None) -> None:
        self.runner.on_stuck_change = callback

    @property
    def on_returned(self) -> Callable[[str, str], None] | None:
        """Called with (hook, key) when a call that was given up on finally returns."""
        return self.runner.on_returned

    @on_returned.setter
    def on_returned(self, callback: Callable[[str, str], None] | None) -> None:
        self.runner.on_returned = callback

    @property
    def stuck_reason(self) -> str:
        return self.runner.stuck_reason

    def implements(self, hook: str) -> bool:
        return self.runner.implements(hook)

    def hook_function(self, hook: str) -> Any:
        """The backend's own function for ``hook`` (None if it has none), for hooks
        the engine runs itself rather than through :meth:`call` (``watch``)."""
        return self.runner.hook_function(hook)

    def warm(self) -> None:
        self.runner.warm()

    async def call(
        self, hook: str, *, timeout: float | None = None, key: str | None = None, **kwargs: Any
    ) -> Any:
        """Call one hook of this backend (see :meth:`.HookRunner.call`)."""
        return await self.runner.call(hook, timeout=timeout, key=key, **kwargs)

    def close(self) -> None:
        self.runner.close()

    # -- options (OptionBinder) -------------------------------------------------

    def read_options(
        self,
        options: Mapping[str, Any],
        *,
        source: str = "",
        flagged: frozenset[str] = frozenset(),
    ) -> Any:
        """What the hooks get as ``options`` (see :meth:`.OptionBinder.read`)."""
        return self.binder.read(options, source=source, flagged=flagged)

    def read_options_from(self, cfg: Config) -> Any:
        """:meth:`read_options` with this backend's options from ``cfg``; a refusal
        names the option where the user wrote it."""
        return self.binder.read_from(cfg)

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
        """:meth:`configure` with this backend's options from ``cfg``; a refusal names
        the file (or flag) and the option as the user wrote it (see
        :func:`.binding.placed`)."""
        await self._configure(self.read_options_from(cfg), cfg)

    async def configure_read(self, value: Any, cfg: Config) -> None:
        """Run the configure hook with options already read (:meth:`read_options_from`:
        a reload checks them before it commits, then calls the hook)."""
        await self._configure(value, cfg)

    async def _configure(self, value: Any, cfg: Config | None = None) -> None:
        try:
            await self.call("configure", options=value)
        except ConfigError as e:
            raise (
                configure_error(self.name, e) if cfg is None else placed(self.name, e, cfg)
            ) from None
        except ValueError as e:
            raise configure_error(self.name, e) from None
        except BackendError as e:  # the hook failed: not a refusal of its options
            raise StartError(str(e)) from e
        self.options = value

    def parse_args(self, args: list[str]) -> dict[str, Any]:
        """Run the ``parse_args`` hook (synchronously: before any loop starts); a
        refusal or a failure is a ConfigError naming this backend."""
        if not self.implements("parse_args"):
            return {}
        try:
            result = self.runner.call_sync("parse_args", {"args": list(args)})
        except ConfigError as e:
            raise configure_error(self.name, e) from None
        except Exception as e:
            raise ConfigError(
                f"backend {self.name!r} hook parse_args raised {e!r}", source="command line"
            ) from None
        return results.parsed_args(self.name, result)

    def config_sections(self) -> dict[str, str]:
        """The config sections this backend claims (its ``config_sections`` hook, run
        synchronously: the config is read before any loop starts)."""
        if not self.implements("config_sections"):
            return {}
        try:
            result = self.runner.call_sync("config_sections", {})
        except Exception as e:
            raise ConfigError(
                f"backend {self.name!r} hook config_sections raised {e!r}", field="backend"
            ) from None
        return results.sections(self.name, result)

    # -- typed hooks: each result checked (results) -----------------------------

    def _shaped(self, hook: str, check: Callable[[str, Any], _T], result: Any) -> _T:
        """``check(name, result)``; a wrong shape names the hook's file and line."""
        try:
            return check(self.name, result)
        except BackendError as e:
            where = defined_at(self.runner.hook_function(hook))
            if not where:
                raise
            raise BackendError(f"{e} (hook {hook} defined at {where})") from None

    async def discover(self) -> list[Device]:
        return self._shaped("discover", results.devices, await self.call("discover"))

    def health_verdict(self, result: Any) -> tuple[bool, str]:
        """A check_health result as (healthy, reason); BackendError for garbage."""
        return self._shaped("check_health", results.health_verdict, result)

    async def check_health(self, device: Device) -> tuple[bool, str]:
        result = await self.call("check_health", key=device.id, device=device)
        return self.health_verdict(result)

    async def check_health_many(
        self, devices: list[Device], on_error: Callable[[BackendError], None] | None = None
    ) -> dict[str, tuple[bool, str]]:
        """check_health over ``devices``: a verdict per device ID (see
        :mod:`.healthcalls`)."""
        return await check_health_many(self.runner, self.health_verdict, devices, on_error)

    async def links(self, devices: list[Device]) -> list[Link]:
        return self._shaped("links", results.links, await self.call("links", devices=devices))

    async def labels(self, devices: list[Device]) -> dict[str, str]:
        return self._shaped("labels", results.labels, await self.call("labels", devices=devices))

    async def metrics(self, devices: list[Device]) -> list[Sample]:
        result = await self.call("metrics", devices=devices)
        return self._shaped("metrics", results.samples, result)

    async def doctor(self, options: Mapping[str, Any]) -> list[Check]:
        return results.checks(await self.call("doctor", options=options))

    async def runtime_advice(self, runtime: Any, needs_cdi: bool, root: str) -> list[Check]:
        result = await self.call("runtime_advice", runtime=runtime, needs_cdi=needs_cdi, root=root)
        return results.checks([result] if isinstance(result, Check) else result)

    async def resource_defaults(self, resource: str) -> dict[str, Any]:
        result = await self.call("resource_defaults", resource=resource)
        return results.mapping(self.name, "resource_defaults", result)

    async def cdi_spec_edits(self, kind: str, devices: list[Device]) -> dict[str, Any]:
        result = await self.call("cdi_spec_edits", kind=kind, devices=devices)
        return results.mapping(self.name, "cdi_spec_edits", result)
