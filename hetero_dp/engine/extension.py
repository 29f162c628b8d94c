"""How day-two pieces plug into the engine without the engine knowing them.

The engine calls each extension at fixed points of its life: ``start`` before the
first publish (so probes can answer "starting"), ``stop`` first at shutdown, and,
on a config reload, ``prepare`` before anything changes (it may refuse with a
ConfigError), then either ``discard`` (the reload was refused elsewhere) or
``apply`` (it went through). ``hetero_dp.ops`` provides the extension that serves
metrics, probes, labels and reload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hetero_dp.engine.config import Config


class Extension(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def prepare(self, old: Config, new: Config) -> None: ...

    async def discard(self) -> None: ...

    async def apply(self, old: Config, new: Config) -> None: ...
