"""Watching the kubelet's dirs for a restart (docs/sources.md#kubelet-restart): ``kubelet.sock``
created, or a plugin's own socket deleted; in watcher mode, its registration
socket deleted. Each sign turns into a restart request of the endpoints concerned."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from hetero_dp.deviceplugin.endpoint import PluginEndpoint
from hetero_dp.kits import observe
from hetero_dp.kits.inotify import DirectoryWatcher
from hetero_dp.model.names import KUBELET_SOCKET

log = logging.getLogger(__name__)


class KubeletDirWatch:
    def __init__(
        self,
        plugin_dir: Path,
        registry_dir: Path | None,
        endpoints: Callable[[], Iterable[PluginEndpoint]],
    ) -> None:
        self.plugin_dir = plugin_dir
        self.registry_dir = registry_dir
        self.endpoints = endpoints
        self._watchers: list[DirectoryWatcher] = []

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        w = DirectoryWatcher(self.plugin_dir, self.on_plugin_dir_event)
        w.start()
        self._watchers.append(w)
        if self.registry_dir is not None:
            self.registry_dir.mkdir(parents=True, exist_ok=True)
            w2 = DirectoryWatcher(self.registry_dir, self.on_registry_dir_event)
            w2.start()
            self._watchers.append(w2)

    def close(self) -> None:
        for w in self._watchers:
            w.close()
        self._watchers.clear()

    def on_plugin_dir_event(self, name: str, kind: str) -> None:
        if kind == "created" and name == KUBELET_SOCKET:
            log.info("kubelet.sock created: the kubelet restarted; re-registering")
            observe.emit("kubelet_restart", reason="kubelet.sock created")
            for ep in self.endpoints():
                if ep.mode == "watcher":
                    # the kubelet's plugin watcher walks plugins_registry on start and
                    # registers us itself; a restart here would only register twice
                    continue
                ep.notify_kubelet_appeared()
                # Still registering (first start, or the kubelet came late) with our
                # socket in place: waking the pending Register is enough. A restart
                # would send a second, overlapping Register that the kubelet may
                # finish in either order.
                if ep.session.registered or not ep.socket_path.exists():
                    ep.request_restart("kubelet.sock created")
            return
        if kind == "deleted":
            for ep in self.endpoints():
                if name == ep.socket_name and not ep.changing and not ep.socket_path.exists():
                    log.info(
                        "own socket %s deleted; restarting",
                        name,
                        extra={"resource": ep.resource.name},
                    )
                    observe.emit("kubelet_restart", reason=f"{name} deleted")
                    ep.request_restart(f"socket {name} deleted")

    def on_registry_dir_event(self, name: str, kind: str) -> None:
        if kind != "deleted":
            return
        for ep in self.endpoints():
            sock = ep.registry_socket
            if sock is not None and name == sock.name and not ep.changing and not sock.exists():
                ep.request_restart(f"registration socket {name} deleted")
