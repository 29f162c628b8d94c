"""One loaded backend: its hooks, called safely, their results checked.

The jobs live in their own modules, each usable without a daemon:
:mod:`.hookrunner` runs hooks as their rows in :data:`hetero_dp.hookspecs.POLICY`
say (threads, timeouts, containment, the check of the result from :mod:`.results`;
``async def`` hooks on the loop), :mod:`.binding` binds the options ``configure``
declares; :mod:`.healthcalls` runs ``check_health`` over many devices.
:class:`Backend` puts them together for the engine: ``await backend.call(hook,
...)`` is every hook's call. Finding and loading backends is
:mod:`hetero_dp.engine.loading`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from hetero_dp.engine.binding import OptionBinder, configure_error, placed
from hetero_dp.engine.healthcalls import check_health_many
from hetero_dp.engine.hookrunner import HookRunner, hook_impls
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError, ConfigError, StartError

if TYPE_CHECKING:
    from hetero_dp.engine.config import Config

__all__ = ["Backend"]


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
        # resource -> why: what required_resources said after the last configure
        self.required: dict[str, str] = {}

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
            required = (
                await self.call("required_resources")
                if self.implements("required_resources")
                else {}
            )
        except ConfigError as e:
            raise (
                configure_error(self.name, e) if cfg is None else placed(self.name, e, cfg)
            ) from None
        except ValueError as e:
            raise configure_error(self.name, e) from None
        except BackendError as e:  # the hook failed: not a refusal of its options
            raise StartError(str(e)) from e
        self.options = value
        self.required = required

    def parse_args(self, args: list[str]) -> dict[str, Any]:
        """Run the ``parse_args`` hook (synchronously: before any loop starts); a
        refusal or a failure is a ConfigError naming this backend."""
        if not self.implements("parse_args"):
            return {}
        try:
            result = self.runner.call_sync("parse_args", {"args": list(args)})
        except ConfigError as e:  # the row's passes: a refusal of the flags
            raise configure_error(self.name, e) from None
        except Exception as e:
            raise ConfigError(
                f"backend {self.name!r} hook parse_args raised {e!r}", source="command line"
            ) from None
        return dict(self.runner.checked("parse_args", result))

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
        return dict(self.runner.checked("config_sections", result))

    # -- check_health over many devices (healthcalls) ----------------------------

    async def check_health_many(
        self, devices: list[Device], on_error: Callable[[BackendError], None] | None = None
    ) -> dict[str, tuple[bool, str]]:
        """check_health over ``devices``: a verdict per device ID (see
        :mod:`.healthcalls`)."""
        return await check_health_many(self.runner, devices, on_error)
