"""Hook timeouts, the health poll and rediscovery loops, and logging follow a reload
(nothing here refuses)."""

from __future__ import annotations

from hetero_dp.engine.config import Config
from hetero_dp.engine.reconfigure.target import Target


class RuntimeSettings:
    def __init__(self, engine: Target) -> None:
        self.engine = engine

    async def prepare(self, old: Config, new: Config) -> None:
        pass

    async def discard(self) -> None:
        pass

    async def apply(self, old: Config, new: Config) -> None:
        for b in self.engine.backends:
            b.timeout = new.hook_timeout
        self.engine.restart_loops(old, new)
        if (old.log_level, old.log_format) != (new.log_level, new.log_format):
            from hetero_dp.kits.logs import setup_logging

            setup_logging(new.log_level, new.log_format)
