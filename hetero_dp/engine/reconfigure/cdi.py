"""The ``cdi`` section: a new spec writer, its dir checked before anything changes;
the old one's specs are removed when it is replaced. ``cdi.runtimeConfig`` is read
again on every reload (a new path, or the runtime's own config changed and SIGHUP
sent): the resources that deliver through CDI fall back to device specs, or stop
falling back, from the next Allocate on."""

from __future__ import annotations

from hetero_dp.engine.cdi_publisher import CDIPublisher, make_cdi_publisher, read_cdi_off
from hetero_dp.engine.config import Config
from hetero_dp.engine.reconfigure.target import Target


class CDISettings:
    def __init__(self, engine: Target) -> None:
        self.engine = engine
        self._new: CDIPublisher | None = None
        self._cdi_off: str | None = None

    async def prepare(self, old: Config, new: Config) -> None:
        if old.cdi != new.cdi:  # enabled unset: the dir is checked when first needed
            self._new = make_cdi_publisher(
                new.cdi, self.engine.advertiser.settings_for, new.source, self.engine.cdi_names
            )
        self._cdi_off = await read_cdi_off(new.cdi.runtime_config)

    async def discard(self) -> None:
        self._new = None

    async def apply(self, old: Config, new: Config) -> None:
        self.engine.cdi_off = self._cdi_off
        for res in self.engine.resources.values():
            res.cdi_off = self._cdi_off
        if old.cdi == new.cdi:
            return
        publishers = self.engine.publishers
        for replaced in [p for p in publishers if isinstance(p, CDIPublisher)]:
            publishers.remove(replaced)
            replaced.remove_specs()  # specs nobody keeps up to date any more
        if self._new is not None:
            publishers.append(self._new)
