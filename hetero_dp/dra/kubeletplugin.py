"""A DRA driver's presence at the kubelet: its service socket, its registration
socket, and the kubelet's verdict.

The driver serves ``DRAPlugin`` and ``DRAResourceHealth`` on ``<plugins dir>/<driver>/dra.sock``,
then offers ``<plugins_registry>/<driver>-reg.sock`` for the kubelet's plugin watcher
(serve before register, as with device plugins); with an instance ID the names are
``dra-<uid>.sock`` and ``<driver>-<uid>-reg.sock``. Every file is this instance's
own: a path another live instance serves on is refused, a stop removes only the files
still the ones bound (same inode), and a registration socket someone deletes is
offered again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import grpc

from hetero_dp.api import pluginregistration_v1_pb2_grpc as reg_grpc
from hetero_dp.dra.servicer import DRARegistrationServicer
from hetero_dp.kits import observe
from hetero_dp.kits.decoding import DecodeGuard
from hetero_dp.kits.inotify import DirectoryWatcher
from hetero_dp.kits.sockets import bind_unix, claim_socket_path, remove_own_socket
from hetero_dp.model.errors import ConfigError

log = logging.getLogger(__name__)

STOP_GRACE = 0.2


class KubeletPlugin:
    """``running()`` says whether the driver still serves (events after its stop are
    ignored); ``resource`` names the driver in events."""

    def __init__(
        self,
        name: str,
        socket_path: Path,
        registry_socket: Path,
        *,
        resource: str,
        running: Callable[[], bool],
    ) -> None:
        self.name = name
        self.socket_path = socket_path
        self.registry_socket = registry_socket
        self.resource = resource
        self.running = running
        self.registered = asyncio.Event()
        self.registration_error = ""
        self._server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None
        self._watcher: DirectoryWatcher | None = None
        self._on_event: Callable[[str, str], None] = lambda name, kind: None
        self._reoffering = False
        # (device, inode) of each socket file this instance bound: only those it removes
        self._bound: dict[Path, tuple[int, int] | None] = {}

    def claim(self, path: Path) -> None:
        """Make ``path`` free to bind: a stale socket goes; a live one is another
        instance's (two pods without ``POD_UID`` share the same names): refused, and
        the first instance keeps serving."""
        try:
            claim_socket_path(path, "instance")
        except ConfigError as e:
            if "another running instance" not in e.reason:
                raise
            raise ConfigError(
                f"DRA driver {self.name}: {path} is the socket of another running instance "
                "of this driver; set POD_UID from the downward API (fieldRef "
                "metadata.uid) so that each pod has its own sockets, or stop the other "
                "instance first",
                field="instance",
            ) from None

    async def serve(self, add_services: Callable[[grpc.aio.Server], None]) -> None:
        """Claim the service socket and serve what ``add_services`` adds on it."""
        self.claim(self.socket_path)
        server = grpc.aio.server(interceptors=[DecodeGuard()])  # bad bodies: INVALID_ARGUMENT
        add_services(server)
        self._bound[self.socket_path] = bind_unix(server, self.socket_path)
        await server.start()
        self._server = server

    async def offer(self) -> None:
        """Serve the registration socket the kubelet's plugin watcher finds."""
        self.registry_socket.parent.mkdir(parents=True, exist_ok=True)
        self.claim(self.registry_socket)
        reg = grpc.aio.server(interceptors=[DecodeGuard()])  # bad bodies: INVALID_ARGUMENT
        reg_grpc.add_RegistrationServicer_to_server(
            DRARegistrationServicer(self.name, str(self.socket_path), self._on_status), reg
        )
        self._bound[self.registry_socket] = bind_unix(reg, self.registry_socket)
        await reg.start()
        self._reg_server = reg

    def _on_status(self, registered: bool, error: str) -> None:
        if registered:
            self.registration_error = ""
            log.info("DRA driver %s registered with the kubelet", self.name)
            observe.emit("registered", resource=self.resource, mode="dra")
            self.registered.set()
        else:
            self.registered.clear()
            self.registration_error = error
            log.error("the kubelet refused DRA driver %s: %s", self.name, error)
            observe.emit("registration_failed", resource=self.resource, reason=error)

    def watch_registry(self, on_event: Callable[[str, str], None]) -> None:
        """Watch ``plugins_registry``: every event goes to ``on_event(name, kind)``
        first; our registration socket deleted is offered again."""
        self._on_event = on_event
        self._watcher = DirectoryWatcher(self.registry_socket.parent, self._on_registry_event)
        self._watcher.start()

    def close_watch(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    def _on_registry_event(self, name: str, kind: str) -> None:
        self._on_event(name, kind)
        # Someone removed our registration socket: offer it again, or the kubelet
        # never finds this driver after its next start.
        if (
            kind == "deleted"
            and name == self.registry_socket.name
            and self.running()
            and not self._reoffering
            and not self.registry_socket.exists()
        ):
            log.warning("registration socket %s deleted; recreating it", self.registry_socket)
            self.registered.clear()
            asyncio.get_running_loop().create_task(self._offer_again())

    async def _offer_again(self) -> None:
        self._reoffering = True
        try:
            if self._reg_server is not None:
                await self._reg_server.stop(STOP_GRACE)
            if self.running():
                await self.offer()
        except ConfigError as e:  # another instance took the name meanwhile
            log.error("cannot offer the registration socket again: %s", e)
        finally:
            self._reoffering = False

    async def stop(self) -> None:
        """Stop both servers and remove the files this instance bound (never another
        instance's)."""
        for server in (self._reg_server, self._server):
            if server is not None:
                await server.stop(STOP_GRACE)
        self._reg_server = self._server = None
        for path in (self.registry_socket, self.socket_path):
            remove_own_socket(path, self._bound.pop(path, None))
        self.registered.clear()
