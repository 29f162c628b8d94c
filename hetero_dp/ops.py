"""Day-two operations of a daemon, wired in one place: metrics with the probe
server (config ``metrics.address``), the node label file (``labels.enabled/dir``)
and config reload (when the daemon was given a config file and a loader)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .config import Config
from .errors import ConfigError
from .labels import LabelWriter, file_name
from .metrics import Metrics
from .probes import ProbeServer
from .reload import ConfigReloader

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger(__name__)


class Operations:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.metrics: Metrics | None = None
        self.server: ProbeServer | None = None
        self.labels: LabelWriter | None = None
        self.reloader: ConfigReloader | None = None
        self._pending: ProbeServer | None = None  # bound by prepare(), installed by apply()

    async def start(self) -> None:
        """Before the daemon's first publish: probes answer "starting", labels follow."""
        cfg = self.daemon.config
        await self._start_server(cfg)
        self._start_labels(cfg)
        d = self.daemon
        if d.config_path is not None and d.config_loader is not None:
            self.reloader = ConfigReloader(d, d.config_path, d.config_loader)
            self.reloader.start()

    async def stop(self) -> None:
        if self.reloader is not None:
            await self.reloader.stop()
            self.reloader = None
        await self._stop_server()
        self._stop_labels()

    async def prepare(self, old: Config, new: Config) -> None:
        """Before a reload commits: bind the new probe address (ConfigError if it cannot)."""
        if old.metrics == new.metrics or not new.metrics.get("address"):
            return
        metrics = self.metrics or Metrics(self.daemon)  # counters survive an address change
        server = ProbeServer(self.daemon, str(new.metrics["address"]), metrics)
        try:
            await server.start()
        except ConfigError as e:
            if metrics is not self.metrics:
                metrics.close()
            raise ConfigError(e.reason, field=e.field, source=new.source) from None
        self._pending = server

    async def discard(self) -> None:
        """The reload was rejected after :meth:`prepare`: drop what it bound."""
        pending, self._pending = self._pending, None
        if pending is not None:
            await pending.stop()
            if pending.metrics is not self.metrics and pending.metrics is not None:
                pending.metrics.close()

    async def apply(self, old: Config, new: Config) -> None:
        """Follow a reloaded config: restart only the parts whose section changed."""
        if old.metrics != new.metrics:
            pending, self._pending = self._pending, None
            if self.server is not None:
                await self.server.stop()
                self.server = None
            if pending is None and self.metrics is not None:
                self.metrics.close()
                self.metrics = None
            if pending is not None:
                self.server, self.metrics = pending, pending.metrics
        if old.labels != new.labels:
            self._stop_labels()
            self._start_labels(new)
            if self.labels is not None:
                await self.labels.refresh()

    async def _start_server(self, cfg: Config) -> None:
        address = str(cfg.metrics.get("address") or "")
        if not address:
            return
        self.metrics = Metrics(self.daemon)
        self.server = ProbeServer(self.daemon, address, self.metrics)
        try:
            await self.server.start()
        except BaseException:
            self.metrics.close()
            self.metrics = self.server = None
            raise

    async def _stop_server(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    def _start_labels(self, cfg: Config) -> None:
        if not cfg.labels.get("enabled"):
            return
        name = file_name(cfg.socket_prefix, [b.name for b in self.daemon.backends])
        self.labels = LabelWriter(self.daemon, str(cfg.labels["dir"]), name)
        self.daemon.publishers.append(self.labels)

    def _stop_labels(self) -> None:
        if self.labels is not None:
            if self.labels in self.daemon.publishers:
                self.daemon.publishers.remove(self.labels)
            self.labels.remove()
            self.labels = None
