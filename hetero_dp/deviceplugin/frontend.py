"""Front end 1: the kubelet's device-plugin API.

One :class:`~hetero_dp.deviceplugin.endpoint.PluginEndpoint` per resource (its own
socket, registration, ListAndWatch streams) and the watch on the kubelet's dirs
that turns a kubelet restart into re-registration. The engine knows it only as a
:class:`~hetero_dp.engine.frontend.FrontEnd`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hetero_dp.deviceplugin.contract import Session
from hetero_dp.deviceplugin.dirwatch import KubeletDirWatch
from hetero_dp.deviceplugin.endpoint import PluginEndpoint
from hetero_dp.engine.config import Config
from hetero_dp.engine.frontend import Attached
from hetero_dp.engine.resource import Resource
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import instance_tag


def make_front_end(cfg: Config, options: Mapping[str, Any]) -> DevicePluginFrontEnd:
    """The device-plugin front end (registered as ``device-plugin``, see
    :data:`hetero_dp.engine.frontend.FRONT_END_GROUP`). Options:
    ``check_kubelet_dir`` (default true: the kubelet's dirs must exist and be
    writable, :func:`check_kubelet_dir`) and ``create_kubelet_dir`` (create them
    if missing)."""
    if options.get("check_kubelet_dir", True):
        check_kubelet_dir(cfg, create=bool(options.get("create_kubelet_dir", False)))
    return DevicePluginFrontEnd()


class DevicePluginFrontEnd(Attached):
    name = "device-plugin"

    def __init__(self) -> None:
        # names this instance's sockets (after its pod: POD_UID / POD_NAME), so that an
        # old and a new pod of a rolling update never share one
        self.instance = instance_tag(os.environ)
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.dir_watch: KubeletDirWatch | None = None
        self._serving = False

    async def open(self) -> None:
        """Nothing to bind before discovery: endpoints come with their resources."""

    def add_resource(self, resource: Resource) -> None:
        """An endpoint for ``resource``; ValueError when its socket path does not fit."""
        cfg = self.engine.config
        ep = PluginEndpoint(
            resource,
            plugin_dir=cfg.kubelet_dir,
            registry_dir=cfg.plugins_registry_dir,
            mode=cfg.registration,
            socket_prefix=cfg.socket_prefix,
            instance=self.instance,
            stream_timeout=cfg.stream_timeout,
        )
        self.endpoints[resource.name] = ep
        if self._serving:  # a resource that appeared later (rediscovery, reload)
            self.engine.tasks.start(f"serve {resource.name}", ep.start())

    async def serve(self) -> None:
        """Watch the kubelet's dirs, then serve and register every endpoint."""
        cfg = self.engine.config
        self.dir_watch = KubeletDirWatch(
            cfg.kubelet_dir,
            cfg.plugins_registry_dir if cfg.registration == "watcher" else None,
            self.endpoints.values,
        )
        self.dir_watch.start()
        self._serving = True
        await asyncio.gather(*(ep.start() for ep in self.endpoints.values()))

    def restart(self, names: Mapping[str, str]) -> None:
        for name, why in sorted(names.items()):
            if name in self.endpoints:
                self.endpoints[name].request_restart(why)

    async def stop(self) -> None:
        self._serving = False
        if self.dir_watch is not None:
            self.dir_watch.close()
            self.dir_watch = None
        await asyncio.gather(*(ep.stop() for ep in self.endpoints.values()))

    def session(self, resource: str) -> Session | None:
        """``resource``'s session with the kubelet (registered, streams), if served."""
        ep = self.endpoints.get(resource)
        return None if ep is None else ep.session

    def readiness(self) -> tuple[bool, list[str]]:
        lines = []
        ok = True
        for name, res in sorted(self.engine.resources.items()):
            session = self.session(name)
            if session is not None and session.ready:
                lines.append(f"{name}: ready ({len(res.state.devices)} devices)")
                continue
            ok = False
            registered = session is not None and session.registered
            why = "no ListAndWatch stream" if registered else "not registered with the kubelet"
            lines.append(f"{name}: not ready: {why}")
        if not lines:
            lines.append("no resources: no backend found devices")
        return ok, lines

    # --- reload (engine/frontend.py Reloadable) ---------------------------------

    async def prepare(self, old: Config, new: Config) -> None:
        """Where sockets live cannot change while running: the engine refuses that."""

    async def discard(self) -> None:
        pass

    async def apply(self, old: Config, new: Config) -> None:
        for ep in self.endpoints.values():
            ep.stream_timeout = new.stream_timeout


def check_kubelet_dir(cfg: Config, *, create: bool) -> None:
    """The device-plugin dir (and in watcher mode the registry dir) must exist and be
    writable before anything starts; ConfigError naming the dir and the fix. With
    ``create``, missing dirs are created."""
    dirs = [("kubeletDir", Path(cfg.kubelet_dir))]
    if cfg.registration == "watcher":
        dirs.append(("pluginsRegistryDir", Path(cfg.plugins_registry_dir)))
    for field, path in dirs:
        if not path.is_absolute():  # from the config file or env: relative to nothing
            raise ConfigError(f"must be an absolute path, got {str(path)!r}", field=field)
        if not path.exists():
            if not create:
                raise ConfigError(
                    f"{path} does not exist: is it the kubelet's dir (a typo, or the host "
                    "dir not mounted)? Pass --create-kubelet-dir to create it",
                    field=field,
                )
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(
                    f"cannot create {path}: {e.strerror}; create it as a user who may, or "
                    "choose another dir",
                    field=field,
                ) from None
        if not path.is_dir():
            raise ConfigError(f"{path} is not a directory", field=field)
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(
                f"{path} is not writable by this user (uid {os.getuid()}): run as root, as "
                "the DaemonSets do, or give this user write access to the dir",
                field=field,
            )
