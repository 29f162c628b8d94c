"""Day-two operations of a daemon, wired in one place: metrics with the probe
server (config ``metrics.address``), the readiness file (``metrics.readyFile``), the
node label file (``labels.enabled/dir``), the attribution loop (``attribution.interval``)
and config reload (when given a config file and a loader).

An engine extension (:mod:`hetero_dp.engine.extension`): :func:`attach` plugs it
into a daemon, which then starts, stops and reconfigures it; it uses only the
daemon's public surface. :func:`day_two` is what
:func:`hetero_dp.engine.build.build_daemon` takes, for the CLI and the test runners
alike."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hetero_dp.engine.config import Config
from hetero_dp.model.errors import ConfigError
from hetero_dp.ops.attributing import Attributing
from hetero_dp.ops.labels import LabelWriter, file_name
from hetero_dp.ops.probes import ProbeServer, parse_address
from hetero_dp.ops.readyfile import ReadyFile

if TYPE_CHECKING:
    from hetero_dp.engine.daemon import Daemon
    from hetero_dp.ops.metrics import Metrics
    from hetero_dp.ops.reload import ConfigReloader

log = logging.getLogger(__name__)


def attach(
    daemon: Daemon,
    config_path: Path | None = None,
    config_loader: Callable[[], Config] | None = None,
) -> Operations:
    """Plug metrics, probes, labels and (with a config file and loader) reload into
    ``daemon``; returns the extension (``ops.server``, ``ops.labels``...)."""
    ops = Operations(daemon, config_path, config_loader)
    daemon.extensions.append(ops)
    return ops


def day_two(
    config_path: Path | None = None, config_loader: Callable[[], Config] | None = None
) -> Callable[[Daemon], Operations]:
    """:func:`attach` with these arguments, for ``build_daemon(extensions=...)``."""
    return lambda daemon: attach(daemon, config_path, config_loader)


def of(daemon: Daemon) -> Operations | None:
    """The operations extension attached to ``daemon``, if any."""
    return next((e for e in daemon.extensions if isinstance(e, Operations)), None)


class Operations:
    def __init__(
        self,
        daemon: Daemon,
        config_path: Path | None = None,
        config_loader: Callable[[], Config] | None = None,
    ) -> None:
        self.daemon = daemon
        self.config_path = config_path
        self.config_loader = config_loader
        self.metrics: Metrics | None = None
        #: attribution, shared by scrapes and its own loop (attribution.interval)
        self.attributing = Attributing(daemon)
        self.server: ProbeServer | None = None
        self.labels: LabelWriter | None = None
        self.ready_file: ReadyFile | None = None
        self.reloader: ConfigReloader | None = None
        self._pending: ProbeServer | None = None  # bound by prepare(), installed by apply()

    async def start(self) -> None:
        """Before the daemon's first publish: probes answer "starting", labels follow."""
        cfg = self.daemon.config
        await self._start_server(cfg)
        self._start_ready_file(cfg)
        self._start_labels(cfg)
        self.attributing.start(cfg.attribution.interval)
        if self.config_path is not None and self.config_loader is not None:
            # only with a config file: the reloader's inotify watch loads ctypes (issue 35)
            from hetero_dp.ops.reload import ConfigReloader

            self.reloader = ConfigReloader(self.daemon, self.config_path, self.config_loader)
            self.reloader.start()

    async def stop(self) -> None:
        await self._stop_ready_file()  # a stopping instance is not ready, first of all
        if self.reloader is not None:
            await self.reloader.stop()
            self.reloader = None
        await self.attributing.close()
        await self._stop_server()
        self._stop_labels()

    async def prepare(self, old: Config, new: Config) -> None:
        """Before a reload commits: bind the new probe address (ConfigError if it cannot)."""
        if _address(old) == _address(new) or not _address(new):
            return
        try:
            parse_address(new.metrics.address)
        except ConfigError as e:
            raise ConfigError(e.reason, field=e.field, source=new.source) from None
        from hetero_dp.ops.metrics import (
            Metrics,  # prometheus_client (~10 MiB) only when metrics are on
        )

        # counters survive an address change
        metrics = self.metrics or Metrics(self.daemon, self.attributing)
        server = ProbeServer(self.daemon, new.metrics.address, metrics)
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
        if _address(old) != _address(new):
            pending, self._pending = self._pending, None
            if self.server is not None:
                await self.server.stop()
                self.server = None
            # Metrics turned off keep counting unserved, so that a reload that turns
            # them on again continues every counter (Prometheus counters only reset
            # with the process: a reset would read as a restart, issue #29).
            if pending is not None:
                self.server, self.metrics = pending, pending.metrics
        if old.attribution.interval != new.attribution.interval:
            self.attributing.start(new.attribution.interval)
        if old.metrics.ready_file != new.metrics.ready_file:
            await self._stop_ready_file()
            self._start_ready_file(new)
        if old.labels != new.labels:
            self._stop_labels()
            self._start_labels(new)
            if self.labels is not None:
                await self.labels.refresh()

    async def _start_server(self, cfg: Config) -> None:
        address = cfg.metrics.address
        if not address:
            return
        from hetero_dp.ops.metrics import (
            Metrics,  # prometheus_client (~10 MiB) only when metrics are on
        )

        self.metrics = Metrics(self.daemon, self.attributing)
        self.server = ProbeServer(
            self.daemon, address, self.metrics, wait_for_port=cfg.metrics.wait_for_port
        )
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

    def _start_ready_file(self, cfg: Config) -> None:
        path = cfg.metrics.ready_file
        if path:
            self.ready_file = ReadyFile(self.daemon, path)
            self.ready_file.start()

    async def _stop_ready_file(self) -> None:
        if self.ready_file is not None:
            await self.ready_file.stop()
            self.ready_file = None

    def _start_labels(self, cfg: Config) -> None:
        if not cfg.labels.enabled:
            return
        name = file_name(cfg.socket_prefix, [b.name for b in self.daemon.backends])
        self.labels = LabelWriter(self.daemon, cfg.labels.dir, name)
        self.daemon.add_publisher(self.labels)

    def _stop_labels(self) -> None:
        if self.labels is not None:
            self.daemon.remove_publisher(self.labels)
            self.labels.remove()
            self.labels = None


def _address(cfg: Config) -> str:
    return cfg.metrics.address
