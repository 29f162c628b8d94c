"""Settings that decide where sockets live: a reload that changes them is refused
(the daemon must restart to apply them)."""

from __future__ import annotations

from hetero_dp.engine.config import Config
from hetero_dp.model.errors import ConfigError

FIXED = {
    "kubelet_dir": "kubeletDir",
    "plugins_registry_dir": "pluginsRegistryDir",
    "registration": "registration",
    "socket_prefix": "socketPrefix",
}


class FixedSettings:
    async def prepare(self, old: Config, new: Config) -> None:
        for attr, key in FIXED.items():
            if getattr(old, attr) != getattr(new, attr):
                raise ConfigError(
                    f"cannot change while running (was {getattr(old, attr)}, now "
                    f"{getattr(new, attr)}); restart the daemon to apply it",
                    field=key,
                    source=new.source,
                )

    async def discard(self) -> None:
        pass

    async def apply(self, old: Config, new: Config) -> None:
        pass
