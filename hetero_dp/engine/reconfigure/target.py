"""What the reload components may use of the engine (the daemon fulfils it)."""

from __future__ import annotations

from typing import Protocol

from hetero_dp.engine.advertising import Advertiser
from hetero_dp.engine.backend import Backend
from hetero_dp.engine.cdi_publisher import CDINames
from hetero_dp.engine.config import Config
from hetero_dp.engine.extension import Extension
from hetero_dp.engine.frontend import Engine, FrontEnd, Publisher


class Target(Engine, Protocol):
    backends: list[Backend]
    publishers: list[Publisher]
    advertiser: Advertiser  # publish, each resource's settings and defaults
    extensions: list[Extension]
    front_end: FrontEnd
    cdi_off: str | None
    cdi_names: CDINames

    async def rediscover(self, backend_name: str | None = None) -> None: ...

    def restart_loops(self, old: Config | None, new: Config) -> None: ...
