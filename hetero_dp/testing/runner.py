"""Run plugins in-process against a (fake or real) kubelet dir, for tests and the demo."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config, load_config
from hetero_dp.engine.daemon import Daemon
from hetero_dp.engine.loading import sections_of
from hetero_dp.ops.assembly import assemble

#: Every dir :func:`short_tempdir` made in this process, so that a test suite can check
#: that each test removes its own (this project's tests/hostguard.py does).
SHORT_TEMPDIRS: list[Path] = []


#: Where a test suite asks every process it starts to note the dirs short_tempdir makes,
#: one path a line (this project's tests/hostguard.py sets it): a subprocess's dirs
#: are not in its SHORT_TEMPDIRS.
SHORT_TEMPDIR_LOG = "HDP_SHORT_TEMPDIR_LOG"


def short_tempdir(prefix: str = "hdp-") -> Path:
    """A fresh temp dir with a short path (unix socket paths must stay under 108 bytes),
    under /tmp whatever TMPDIR says. The caller removes it."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    SHORT_TEMPDIRS.append(path)
    log = os.environ.get(SHORT_TEMPDIR_LOG)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{path}\n")
    return path


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


def keep_off_the_host(raw: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Point every host path of a config document that it leaves at its default into
    ``scratch``: CDI specs (default /var/run/cdi, which container runtimes read), node
    labels (default /etc/kubernetes/node-feature-discovery/features.d), the plugin
    registry (default /var/lib/kubelet/plugins_registry), the pod-resources socket
    attribution asks (default /var/lib/kubelet/pod-resources/kubelet.sock; where the
    fake kubelet's ``serve_pod_resources`` puts it) and the container log links it
    reads (default /var/log/containers). A daemon in a test or the demo
    must never advertise its fake devices to the real node it runs on, nor read its pods."""
    raw.setdefault("pluginsRegistryDir", str(scratch / "plugins_registry"))
    given = raw.get("attribution")
    if given is None or isinstance(given, dict):
        socket = str(scratch / "pod-resources" / "kubelet.sock")
        logs = str(scratch / "containers")  # the kubelet's /var/log/containers
        raw["attribution"] = {
            "podResourcesSocket": socket,
            "containerLogsDir": logs,
            **(given or {}),
        }
    for section, default in (("cdi", "cdi"), ("labels", "features.d")):
        given = raw.get(section)
        if given is None or isinstance(given, dict):
            raw[section] = {"dir": str(scratch / default), **(given or {})}
    return raw


def read_test_config(raw: Mapping[str, Any], loaded: list[Backend]) -> Config:
    """The config of ``raw`` with the sections ``loaded`` claim, as ``hetero-dp run``
    reads it (a backend from a ``.py`` file has its sections read too), the
    environment left out."""
    return load_config(raw=raw, env={}, sections=sections_of(loaded))


class PluginRunner:
    """Start daemons serving backends into ``plugin_dir``; stop them all at the end.

    Every other host path the daemon would use by default (CDI specs, node labels, the
    plugin registry) goes into ``scratch_dir`` (default: the dir holding ``plugin_dir``,
    a temp dir for the fixtures and the demo) unless ``config`` names one."""

    def __init__(
        self,
        plugin_dir: Path,
        registry_dir: Path | None = None,
        base_dir: Path | None = None,
        scratch_dir: Path | None = None,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.registry_dir = registry_dir
        self.scratch_dir = Path(scratch_dir) if scratch_dir else self.plugin_dir.parent
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
        keep_off_the_host(raw, self.scratch_dir)
        # the kubelet dir is made above; hetero-dp run checks it
        return await self.assemble(backends, raw, "device-plugin", {"check_kubelet_dir": False})

    async def assemble(
        self,
        backends: tuple[str | ModuleType | object, ...],
        raw: Mapping[str, Any],
        mode: str,
        front_end: Mapping[str, Any],
    ) -> Daemon:
        """Start the daemon ``hetero-dp run`` builds (:func:`hetero_dp.ops.assembly.
        assemble`, the same call): ``backends`` loaded first (the config sections they
        claim are read from ``raw``, as ``hetero-dp run`` reads them), the front end
        registered as ``mode``, metrics, probes and labels attached as there. A test's
        fake device nodes are plain files in the temp dir (tmp_path): the container
        gate takes them there, and only there, for nodes."""
        daemon = assemble(
            [self._where(b) for b in backends],
            lambda loaded: read_test_config(raw, loaded),
            mode=mode,
            front_end=front_end,
            fake_nodes=os.path.realpath(tempfile.gettempdir()),
        )
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
