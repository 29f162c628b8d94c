"""Resource settings follow a reload: a new sharing must fit the devices there are;
a re-configured backend may give other defaults (the bundled GPU backend:
deviceListStrategy -> deliver); resources whose settings or sharing changed are
served again by the front end (:class:`Restarts`), every other stream stays open."""

from __future__ import annotations

import dataclasses
from typing import Any

from hetero_dp.allocation.sharing import SharingConfig
from hetero_dp.engine.config import Config
from hetero_dp.engine.reconfigure.backends import BackendOptions
from hetero_dp.engine.reconfigure.target import Target
from hetero_dp.engine.settings import ResourceSettings
from hetero_dp.model.errors import ConfigError


def _sharing_view(sharing: SharingConfig, physical: str) -> tuple[Any, ...]:
    """What sharing does to one physical resource: its entry, its shared name, its rules."""
    entry = sharing.entry_for(physical)
    if entry is None:
        return (None,)
    entry = dataclasses.replace(entry, field="")  # where it sits in the file does not matter
    return (entry, sharing.shared_name(physical), sharing.fail_requests_greater_than_one)


class ResourceChanges:
    def __init__(self, engine: Target, backends: BackendOptions) -> None:
        self.engine = engine
        self.backends = backends
        self.restart: set[str] = set()
        self._before: dict[str, ResourceSettings] = {}

    async def prepare(self, old: Config, new: Config) -> None:
        if new.sharing != old.sharing:  # the new sharing must fit the devices there are
            physical = [d for rt in self.engine.runtimes.values() for d in rt.discovered.values()]
            try:
                new.sharing.validate_devices(physical)
            except ConfigError as e:
                raise ConfigError(e.reason, field=e.field, source=new.source) from None
        settings_for = self.engine.advertiser.settings_for
        self._before = {name: settings_for(name) for name in self.engine.resources}

    async def discard(self) -> None:
        self._before = {}

    async def apply(self, old: Config, new: Config) -> None:
        engine = self.engine
        advertiser = engine.advertiser
        for b in self.backends.changed:
            await advertiser.renew_defaults(engine.runtimes[b.name])
        restart = {
            name
            for name in engine.resources
            if advertiser.settings_for(name) != self._before.get(name)
        }
        affected = self._sharing_affected(old, new)
        for res in engine.resources.values():
            res.sharing = new.sharing
            res.settings = advertiser.settings_for(res.name)  # defaults under the new entry
        self.restart = restart | (affected & set(engine.resources))

    def _sharing_affected(self, old: Config, new: Config) -> set[str]:
        """Advertised resources (old and new names) whose sharing changed."""
        if old.sharing == new.sharing:
            return set()
        names: set[str] = set()
        for rt in self.engine.runtimes.values():
            for physical, advertised in rt.resources.items():
                if _sharing_view(old.sharing, physical) != _sharing_view(new.sharing, physical):
                    names |= {physical, *advertised, new.sharing.shared_name(physical)}
        return names


class Restarts:
    """After the publishes: the front end serves the changed resources again."""

    def __init__(self, engine: Target, resources: ResourceChanges) -> None:
        self.engine = engine
        self.resources = resources

    async def prepare(self, old: Config, new: Config) -> None:
        pass

    async def discard(self) -> None:
        pass

    async def apply(self, old: Config, new: Config) -> None:
        why = "its configuration changed"
        self.engine.front_end.restart({name: why for name in self.resources.restart})
