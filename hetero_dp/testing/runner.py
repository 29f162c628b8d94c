"""Run plugins in-process against a (fake or real) kubelet dir, for tests and the demo."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from hetero_dp.engine.config import load_config
from hetero_dp.engine.daemon import Daemon
from hetero_dp.engine.loading import load_backends
from hetero_dp.ops import operations


def short_tempdir(prefix: str = "hdp-") -> Path:
    """A fresh temp dir with a short path (unix socket paths must stay under 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def test_config(
    config: Mapping[str, Any] | None, options: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, Any]:
    """A config document for tests: polling and rediscovery off unless ``config`` sets
    them, ``options`` merged into ``backends.<name>``."""
    raw: dict[str, Any] = {"healthInterval": 0, "rediscoverInterval": 0}
    raw.update(config or {})
    if options:
        merged = dict(raw.get("backends") or {})
        for name, opts in options.items():
            merged[name] = {**merged.get(name, {}), **opts}
        raw["backends"] = merged
    return raw


class PluginRunner:
    """Start daemons serving backends into ``plugin_dir``; stop them all at the end."""

    def __init__(
        self, plugin_dir: Path, registry_dir: Path | None = None, base_dir: Path | None = None
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.registry_dir = registry_dir
        # A relative plugin path not found from the working directory is looked for
        # here (the fixture sets the test file's dir), so a test passes from any dir.
        self.base_dir = base_dir
        self.daemons: list[Daemon] = []

    def _where(self, spec: str | ModuleType | object) -> str | ModuleType | object:
        if not isinstance(spec, str) or self.base_dir is None:
            return spec
        if not (spec.endswith(".py") or "/" in spec) or Path(spec).is_absolute():
            return spec
        if Path(spec).exists() or not (self.base_dir / spec).exists():
            return spec
        return str(self.base_dir / spec)

    async def start(
        self,
        *backends: str | ModuleType | object,
        config: Mapping[str, Any] | None = None,
        options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Daemon:
        """Load ``backends`` (names, ``.py`` paths or modules) and start a daemon.

        A relative ``.py`` path is taken from the working directory, else from the
        test file's directory (the ``plugin_runner`` fixture's ``base_dir``). A file
        importable by name (its dir on ``sys.path``, as pytest puts a test's dir)
        runs as that module: a test that imports it sees the daemon's module.
        The kubelet dir is created if missing (``hetero-dp run`` refuses a missing one
        unless given ``--create-kubelet-dir``).

        ``config`` is a config document as in the YAML file; ``options`` adds
        ``backends.<name>`` options. Health polling and rediscovery are off
        unless ``config`` sets their intervals, so tests drive them explicitly.
        """
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        raw = test_config(config, options)
        raw["kubeletDir"] = str(self.plugin_dir)
        if self.registry_dir is not None:
            raw.setdefault("pluginsRegistryDir", str(self.registry_dir))
        cfg = load_config(raw=raw, env={})
        specs = [self._where(b) for b in backends]
        daemon = Daemon(cfg, load_backends(specs, timeout=cfg.hook_timeout))
        operations.attach(daemon)  # metrics, probes and labels, as ``hetero-dp run`` has
        return await self.launch(daemon)

    async def launch(self, daemon: Daemon) -> Daemon:
        """Start ``daemon``; it is stopped with the others at the end (or now, if it fails)."""
        self.daemons.append(daemon)
        try:
            await daemon.start()
        except BaseException:
            await daemon.stop()
            self.daemons.remove(daemon)
            raise
        return daemon

    async def stop(self, daemon: Daemon) -> None:
        if daemon in self.daemons:
            self.daemons.remove(daemon)
            await daemon.stop()

    async def stop_all(self) -> None:
        for d in list(self.daemons):
            await self.stop(d)
