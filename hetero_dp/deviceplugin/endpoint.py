"""One resource's presence at the kubelet: its gRPC server, its registration,
and its restarts.

Order matters (the kubelet dials back: docs/sources.md#device-plugin-api): serve
first, then register. A restart is
stop-then-start: streams end on an event set before the server stops (a
grpc.aio server would otherwise wait on them), the socket is removed and bound
again, and registration runs again. Restart requests are coalesced: however
many arrive while one runs, at most one more follows.

Each instance has its own socket (``<prefix>-<resource>-<instance>.sock``, the
instance named after its pod), so an old and a new pod of a DaemonSet serve side
by side during a rolling update; an instance removes only the socket files it
bound (same inode), and at start-up the sockets of dead instances (nobody answers
on them). When the kubelet ends our stream while the kubelet itself is up, we
register again at once: the kubelet 1.32 device manager disconnects the current
client of a resource whenever any client's stream ends
(``pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go`` ``runClient``), which
is us when an older instance of the same resource leaves after we registered.

The pieces: :mod:`.server` (the gRPC servers and the socket files they own),
:mod:`.registrar` (registration with retries and back-off, one generation per
server), :mod:`.streamwatch` (the stream watchdog and the hand-over); this module
supervises restarts of them all.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from hetero_dp.deviceplugin.contract import ServedResource, Session
from hetero_dp.deviceplugin.registrar import TASK_STOP_TIMEOUT, Registrar
from hetero_dp.deviceplugin.server import PluginServer
from hetero_dp.kits.aiotools import cancel_and_wait
from hetero_dp.kits.sockets import check_socket_path, remove_stale_sockets
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import KUBELET_SOCKET, socket_name

log = logging.getLogger(__name__)

# How long stop() waits for a restart in progress before cancelling it.
SUPERVISOR_STOP_TIMEOUT = 4.0


class PluginEndpoint:
    """One resource at the kubelet: its server (:class:`.server.PluginServer`), its
    registration (:class:`.registrar.Registrar`) and the restarts that renew both."""

    def __init__(
        self,
        resource: ServedResource,
        *,
        plugin_dir: Path,
        registry_dir: Path | None = None,
        mode: str = "classic",
        socket_prefix: str = "hetero-dp",
        stream_timeout: float = 30.0,
        instance: str = "",
    ) -> None:
        self.resource = resource
        self.session = Session()  # registered, streams: this front end's, not the engine's
        self.plugin_dir = Path(plugin_dir)
        self.registry_dir = Path(registry_dir) if registry_dir else None
        self.mode = mode
        self.socket_prefix = socket_prefix
        self.socket_name = socket_name(socket_prefix, resource.name, instance)
        self.socket_path = self.plugin_dir / self.socket_name
        self.registry_socket = (
            self.registry_dir / self.socket_name.replace(".sock", "-reg.sock")
            if self.registry_dir
            else None
        )
        self.stream_timeout = stream_timeout
        self.kubelet_appeared = asyncio.Event()
        self.restarts = 0
        self._restart_wanted = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._changing = False
        self._running = False
        check_socket_path(self.socket_path)
        if self.registry_socket is not None:
            check_socket_path(self.registry_socket)
        self.server = PluginServer(resource, self.session, self.socket_path, self.registry_socket)
        self.registrar = Registrar(
            resource,
            self.session,
            kubelet_socket=self.plugin_dir / KUBELET_SOCKET,
            socket_name=self.socket_name,
            socket_path=self.socket_path,
            classic=mode == "classic",
            kubelet_appeared=self.kubelet_appeared,
            stream_timeout=lambda: self.stream_timeout,
            running=lambda: self._running,
            request_restart=self.request_restart,
        )

    # --- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        self._running = True
        for directory, suffix in ((self.plugin_dir, ".sock"), (self.registry_dir, "-reg.sock")):
            if directory is None or (directory == self.registry_dir and self.mode != "watcher"):
                continue
            for path in remove_stale_sockets(directory, self.socket_prefix, suffix):
                log.info(
                    "removed stale socket %s (nobody answers on it)",
                    path,
                    extra={"resource": self.resource.name},
                )
        await self._start_server()
        self._supervisor = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"supervise {self.resource.name}"
        )

    async def stop(self) -> None:
        self._running = False
        if self._supervisor is not None:
            # Wake it to end rather than cancel it: cancelled inside a restart, it could
            # leave a server it was starting listening (the _stop_server below stops it).
            self._restart_wanted.set()
            done, _ = await asyncio.wait({self._supervisor}, timeout=SUPERVISOR_STOP_TIMEOUT)
            if not done:
                left = await cancel_and_wait([self._supervisor], TASK_STOP_TIMEOUT)
                log.error(
                    "a restart did not finish within %.0fs of stopping; cancelled it%s",
                    SUPERVISOR_STOP_TIMEOUT,
                    f" (still running: {left})" if left else "",
                    extra={"resource": self.resource.name},
                )
            self._supervisor = None
        await self._stop_server()

    def request_restart(self, reason: str) -> None:
        """Ask for a stop-then-start; cheap, coalesced, safe to call from callbacks."""
        if not self._running:
            return
        log.info("restart requested: %s", reason, extra={"resource": self.resource.name})
        self._restart_wanted.set()

    def notify_kubelet_appeared(self) -> None:
        self.kubelet_appeared.set()

    @property
    def changing(self) -> bool:
        """True while the server is being stopped or started (own socket events expected)."""
        return self._changing

    async def _supervise(self) -> None:
        while self._running:
            await self._restart_wanted.wait()
            self._restart_wanted.clear()
            if not self._running:
                return
            self.restarts += 1
            await self._stop_server()
            try:
                await self._start_server()
            except ConfigError as e:  # another instance took the path meanwhile
                log.error("cannot serve again: %s", e, extra={"resource": self.resource.name})

    def _reason(self) -> str:
        return "restart" if self.restarts else "start"

    async def _start_server(self) -> None:
        self._changing = True
        try:
            self.registrar.begin(await self.server.start())
            if self.mode == "watcher":
                await self.server.start_registry(self._on_status)
            else:
                self.registrar.register(self._reason())
        finally:
            self._changing = False
        if self._running and not self.socket_path.exists():
            # deleted while we bound it: the daemon ignores deletions while we change,
            # and the kubelet could never dial back to it
            self.request_restart(f"socket {self.socket_name} deleted while starting")

    def _on_status(self, registered: bool, error: str) -> None:
        self.registrar.on_status(registered, error, self._reason())

    async def _stop_server(self) -> None:
        self._changing = True
        try:
            self.registrar.invalidate()
            await self.server.stop(self.registrar.cancel_tasks)
        finally:
            self._changing = False
