"""Backends whose options changed are re-configured (all or none: those done are
rolled back when one refuses), then rediscover; every other backend publishes again
so CDI specs and labels follow new settings (streams wake only on a change)."""

from __future__ import annotations

import logging

from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.engine.reconfigure.target import Target
from hetero_dp.model.errors import ConfigError

log = logging.getLogger("hetero_dp.engine.reconfigure")


async def _restore(backends: list[Backend], old: Config) -> None:
    for b in backends:
        try:
            await b.configure_from(old)
        except ConfigError as e:
            log.error("restoring the old options of backend %r failed: %s", b.name, e)


class BackendOptions:
    def __init__(self, engine: Target) -> None:
        self.engine = engine
        self.changed: list[Backend] = []
        self._old: Config | None = None

    async def prepare(self, old: Config, new: Config) -> None:
        changed = [
            b
            for b in self.engine.backends
            if old.backend_options(b.name) != new.backend_options(b.name)
        ]
        done: list[Backend] = []
        for b in changed:
            try:
                await b.configure_from(new)
            except ConfigError:
                await _restore(done, old)
                raise
            done.append(b)
        self.changed, self._old = changed, old

    async def discard(self) -> None:
        if self._old is not None:
            await _restore(self.changed, self._old)
        self.changed = []

    async def apply(self, old: Config, new: Config) -> None:
        for b in self.changed:
            await self.engine.rediscover(b.name)
        for rt in self.engine.runtimes.values():
            if rt.backend not in self.changed:
                await self.engine.publish(rt)
