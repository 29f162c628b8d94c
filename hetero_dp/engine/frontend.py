"""How devices reach the kubelet: the front-end interface.

One engine (:class:`hetero_dp.engine.daemon.Daemon`: backends, resources, health,
publishing) serves through exactly one front end, chosen when the daemon is built
(:func:`hetero_dp.engine.build.build_daemon`); the engine imports neither. Front
ends register themselves as backends do, through an entry-point group
(:data:`FRONT_END_GROUP`, ``hetero-dp run --mode NAME`` looks the name up with
:func:`front_end_maker`):

- :class:`hetero_dp.deviceplugin.frontend.DevicePluginFrontEnd`: one device-plugin
  endpoint per resource, registered with the kubelet, and the kubelet dir watch;
- :class:`hetero_dp.dra.frontend.DRAFrontEnd`: one DRA driver per resource
  (ResourceSlices, NodePrepareResources).

A front end sees the engine through :class:`Engine` only, and takes part in a
config reload as every reloadable component does (:class:`Reloadable`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from hetero_dp.engine.claimhooks import ClaimHooks
from hetero_dp.engine.config import Config
from hetero_dp.engine.resource import Resource
from hetero_dp.engine.runtime import BackendRuntime
from hetero_dp.kits.entrypoints import entry_points
from hetero_dp.kits.tasks import Tasks
from hetero_dp.model.errors import ConfigError

#: The entry-point group front ends register in: ``NAME = "module:make_front_end"``,
#: the function a :data:`MakeFrontEnd`.
FRONT_END_GROUP = "hetero_dp.front_ends"

Publisher = Callable[[BackendRuntime], Any]


class Reloadable(Protocol):
    """One component a config change touches.

    ``prepare`` runs before anything changes and may refuse (ConfigError: the old
    config is kept); then either ``discard`` (some component refused: drop what
    ``prepare`` made) or ``apply`` (every component agreed: follow the new config;
    nothing refuses any more)."""

    async def prepare(self, old: Config, new: Config) -> None: ...

    async def discard(self) -> None: ...

    async def apply(self, old: Config, new: Config) -> None: ...


class Engine(Protocol):
    """What a front end may use of the engine."""

    config: Config
    runtimes: dict[str, BackendRuntime]
    claim_hooks: ClaimHooks  # prepare, unprepare, partitions, spec edits: through the engine
    resources: dict[str, Resource]
    ready: asyncio.Event
    tasks: Tasks

    def add_publisher(self, publisher: Publisher) -> None: ...

    async def wait_stopped(self) -> None:
        """Returns once a stop was asked (SIGTERM), also during start-up."""
        ...


class Served(Protocol):
    """What a front end says of one resource's session with the kubelet (metrics):
    the front end keeps that state, the engine's resource knows nothing of it."""

    @property
    def registered(self) -> bool: ...

    @property
    def open_streams(self) -> int: ...

    @property
    def ready(self) -> bool: ...


class FrontEnd(Reloadable, Protocol):
    """The engine calls these, in this order: ``attach`` once when built; at start-up
    ``open`` (before the first discovery; ConfigError stops start-up), ``add_resource``
    for every resource the publishes create (ValueError: this one cannot be served),
    ``serve`` (after the first publish of every backend: serve and register); on a
    reload the :class:`Reloadable` steps and ``restart`` for resources whose
    settings changed; ``stop`` at shutdown. ``readiness`` answers ``/readyz``."""

    name: str

    def attach(self, engine: Engine) -> None: ...

    async def open(self) -> None: ...

    def add_resource(self, resource: Resource) -> None: ...

    async def serve(self) -> None: ...

    def restart(self, names: Mapping[str, str]) -> None:
        """Serve the resources ``names`` (name -> why) again after their settings changed."""
        ...

    async def stop(self) -> None: ...

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, one line per resource or driver), once the engine has started."""
        ...

    def session(self, resource: str) -> Served | None:
        """``resource``'s session with the kubelet, for metrics (None: this front end
        keeps none per resource)."""
        ...


class Attached:
    """What every front end does with its engine: ``attach`` keeps it, ``engine`` gives
    it back (an AssertionError before ``attach``, a programming error). A front end
    that needs more at attach time extends ``attach`` and calls this one first."""

    _engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        assert self._engine is not None, "attach() the front end to an engine first"
        return self._engine

    def attach(self, engine: Engine) -> None:
        self._engine = engine


#: What a front end registers: ``make(config, options)`` builds it from the loaded
#: config and its own options (the run command's flags for it, or what a test runner
#: passes); ConfigError for options it refuses.
MakeFrontEnd = Callable[[Config, Mapping[str, Any]], FrontEnd]


def front_end_names() -> list[str]:
    """The names of the installed front ends (``--mode`` values)."""
    return sorted({ep.name for ep in entry_points(group=FRONT_END_GROUP)})


def front_end_maker(mode: str) -> MakeFrontEnd:
    """The registered maker of front end ``mode``; ConfigError naming the installed
    ones if there is none by that name."""
    for ep in entry_points(group=FRONT_END_GROUP):
        if ep.name == mode:
            maker: MakeFrontEnd = ep.load()  # type: ignore[assignment]
            return maker
    known = ", ".join(front_end_names()) or (
        "none: the entry points of hetero-dp are not installed (reinstall it: make install)"
    )
    raise ConfigError(f"no front end {mode!r} is installed (installed: {known})", field="mode")
