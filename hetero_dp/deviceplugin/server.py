"""One resource's gRPC servers and the socket files they own.

The device-plugin server on ``<kubelet dir>/<socket name>`` and, in watcher mode,
the registration server on ``<plugins_registry>/<socket name>-reg.sock``. Each file
is bound by :func:`~hetero_dp.kits.sockets.bind_unix`, which returns its (device,
inode); a stop removes only files that are still the ones bound (another instance
may have put its own at the path since), and a start refuses a path that another
live instance serves on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from hetero_dp.api import pluginregistration_v1_pb2_grpc as reg_grpc
from hetero_dp.deviceplugin.contract import ServedResource, Session
from hetero_dp.deviceplugin.registration import WatcherRegistrationServicer
from hetero_dp.deviceplugin.servicer import DevicePluginServicer, add_to_server
from hetero_dp.kits.aiotools import wait_event
from hetero_dp.kits.decoding import DecodeGuard
from hetero_dp.kits.sockets import bind_unix, claim_socket_path, remove_own_socket

log = logging.getLogger(__name__)

# How long a stop lets calls in flight (an Allocate) finish; the server stops as soon
# as none is left, so an idle instance does not wait at all.
STOP_GRACE = 5.0


class PluginServer:
    def __init__(
        self,
        resource: ServedResource,
        session: Session,
        socket_path: Path,
        registry_socket: Path | None,
    ) -> None:
        self.resource = resource
        self.session = session
        self.socket_path = socket_path
        self.registry_socket = registry_socket
        self._server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None
        self._servicer: DevicePluginServicer | None = None
        # (device, inode) of each socket file we bound: only those are ours to remove
        self._bound: dict[Path, tuple[int, int] | None] = {}

    @property
    def serving(self) -> bool:
        """True while the device-plugin server is up (from its start to its stop)."""
        return self._server is not None

    async def start(self) -> DevicePluginServicer:
        """Claim the socket path (a stale socket goes; a live one is refused with a
        ConfigError), reopen the resource's streams and serve; returns the servicer."""
        res = self.resource
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if claim_socket_path(self.socket_path, "socketPrefix"):
            log.info("removed stale socket %s", self.socket_path, extra={"resource": res.name})
        res.state.reopen()
        servicer = DevicePluginServicer(res, self.session)
        server = grpc.aio.server()
        add_to_server(servicer, server)  # undecodable requests: INVALID_ARGUMENT
        self._bound[self.socket_path] = bind_unix(server, self.socket_path)
        await server.start()
        self._server = server
        self._servicer = servicer
        return servicer

    async def start_registry(self, on_status: Callable[[bool, str], None]) -> None:
        """Watcher mode: serve ``pluginregistration.Registration`` on the registry
        socket; ``on_status`` hears the kubelet's verdict."""
        assert self.registry_socket is not None
        self.registry_socket.parent.mkdir(parents=True, exist_ok=True)
        claim_socket_path(self.registry_socket, "socketPrefix")
        reg = grpc.aio.server(interceptors=[DecodeGuard()])  # bad bodies: INVALID_ARGUMENT
        reg_grpc.add_RegistrationServicer_to_server(
            WatcherRegistrationServicer(self.resource.name, str(self.socket_path), on_status),
            reg,
        )
        self._bound[self.registry_socket] = bind_unix(reg, self.registry_socket)
        await reg.start()
        self._reg_server = reg

    def _bound_paths(self) -> list[tuple[Path, grpc.aio.Server | None]]:
        paths: list[tuple[Path, grpc.aio.Server | None]] = [(self.socket_path, self._server)]
        if self.registry_socket is not None:
            paths.append((self.registry_socket, self._reg_server))
        return paths

    async def stop(self, end_tasks: Callable[[], Awaitable[None]]) -> None:
        """Stop both servers: calls in flight finish first (within STOP_GRACE), then
        the resource's streams end, then ``end_tasks()`` (the tasks that registered
        this server) runs, then the servers stop and the sockets we bound go."""
        res = self.resource
        servers = [s for s in (self._reg_server, self._server) if s is not None]
        # only sockets this endpoint bound, and only while they are still the files
        # it bound: one that start-up refused to take over belongs to another
        # instance, and one bound since at the same path by someone else stays
        bound = {p for p, srv in self._bound_paths() if srv is not None}
        stopping: asyncio.Future[Any] | None = None
        servicer = self._servicer
        if servicer is not None and servicer.calls_in_flight:
            # Let the kubelet's calls in flight finish before our streams end: then
            # kubelet 1.32 closes its connection (PluginDisconnected), which would
            # cancel them. The servers stop first, so that no new call starts
            # meanwhile (gRPC refuses them once a stop began; it waits up to the
            # grace for the calls it has, streams included, which end below).
            stopping = asyncio.gather(*(s.stop(STOP_GRACE) for s in servers))
            await wait_event(servicer.idle, STOP_GRACE)
        res.state.close()  # ends every ListAndWatch before the server stops
        await end_tasks()
        if stopping is None:
            stopping = asyncio.gather(*(s.stop(STOP_GRACE) for s in servers))
        await stopping
        self._server = self._reg_server = None
        for path in bound:
            remove_own_socket(path, self._bound.pop(path, None))
