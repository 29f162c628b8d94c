"""Backends whose options changed: prepared by reading the new options (the options
reader checks every value; no hook of the live backend runs), committed by calling
each one's ``configure`` hook (all or none: those done are given their old options
back when one refuses), then they rediscover; every other backend publishes again so
CDI specs and labels follow new settings (streams wake only on a change)."""

from __future__ import annotations

import logging
from typing import Any

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
        self._read: dict[str, Any] = {}

    async def prepare(self, old: Config, new: Config) -> None:
        """Check only: each changed backend's new options read as its hooks will get
        them (a refusal names the option). The live backend is not called."""
        changed = [
            b
            for b in self.engine.backends
            if old.backend_options(b.name) != new.backend_options(b.name)
        ]
        self._read = {b.name: b.read_options_from(new) for b in changed}
        self.changed = changed

    async def commit(self, old: Config, new: Config) -> None:
        """After every component prepared: the changed backends' ``configure`` hooks,
        the one step of a reload a live backend hears of. A backend may still refuse
        there (a check only it can make, against its devices): those configured before
        it get their old options back, and the reload is refused."""
        done: list[Backend] = []
        for b in self.changed:
            try:
                await b.configure_read(self._read[b.name], new)
            except ConfigError:
                await _restore(done, old)
                self.changed, self._read = [], {}
                raise
            done.append(b)

    async def discard(self) -> None:
        self.changed, self._read = [], {}

    async def apply(self, old: Config, new: Config) -> None:
        for b in self.changed:
            await self.engine.rediscover(b.name)
        for rt in self.engine.runtimes.values():
            if rt.backend not in self.changed:
                await self.engine.advertiser.publish(rt)
