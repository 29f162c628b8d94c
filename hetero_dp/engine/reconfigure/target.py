"""What the reload components may use of the engine (the daemon fulfils it)."""

from __future__ import annotations

from typing import Any, Protocol

from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.engine.extension import Extension
from hetero_dp.engine.frontend import Engine, FrontEnd, Publisher
from hetero_dp.engine.runtime import BackendRuntime


class Target(Engine, Protocol):
    backends: list[Backend]
    publishers: list[Publisher]
    resource_defaults: dict[str, dict[str, Any]]
    extensions: list[Extension]
    front_end: FrontEnd
    cdi_off: str | None

    @property
    def owner(self) -> dict[str, str]: ...

    def settings_for(self, name: str) -> dict[str, Any]: ...

    async def load_defaults(self, name: str, rt: BackendRuntime) -> None: ...

    async def rediscover(self, backend_name: str | None = None) -> None: ...

    async def publish(self, rt: BackendRuntime) -> None: ...

    def restart_loops(self, old: Config | None, new: Config) -> None: ...
