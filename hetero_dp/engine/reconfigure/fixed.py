"""Settings a reload cannot apply, as declared (engine/settings.py, each setting's
``reload``): a change of one that decides where sockets live (``refused``) refuses the
reload (the daemon must restart to apply it); a change of one read only at start-up
(``next start``) is applied with the rest and said, naming the key, to wait for the
next start. Every other setting takes effect (the other components here)."""

from __future__ import annotations

import logging

from hetero_dp.engine.config import Config
from hetero_dp.engine.settings import BY_KEY, NEXT_START, REFUSED, value_at
from hetero_dp.model.errors import ConfigError

log = logging.getLogger("hetero_dp.engine.reconfigure")


def changed(old: Config, new: Config, keys: tuple[str, ...]) -> list[str]:
    """The keys among ``keys`` whose value differs between ``old`` and ``new``."""
    return [k for k in keys if value_at(old, BY_KEY[k].path) != value_at(new, BY_KEY[k].path)]


class FixedSettings:
    def __init__(self) -> None:
        self.next_start: list[str] = []  # changed keys that wait for the next start

    async def prepare(self, old: Config, new: Config) -> None:
        for key in changed(old, new, REFUSED):
            path = BY_KEY[key].path
            raise ConfigError(
                f"cannot change while running (was {value_at(old, path)}, now "
                f"{value_at(new, path)}); restart the daemon to apply it",
                field=key,
                source=new.source,
            )
        self.next_start = changed(old, new, NEXT_START)

    async def discard(self) -> None:
        self.next_start = []

    async def apply(self, old: Config, new: Config) -> None:
        for key in self.next_start:
            log.warning(
                "%s, field %r: changed to %s, which is read at start-up only: it takes "
                "effect when the daemon restarts",
                new.source,
                key,
                value_at(new, BY_KEY[key].path),
            )
