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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from hetero_dp.api import pluginregistration_v1_pb2_grpc as reg_grpc
from hetero_dp.deviceplugin.contract import ServedResource
from hetero_dp.deviceplugin.registration import (
    WatcherRegistrationServicer,
    register_with_backoff,
)
from hetero_dp.deviceplugin.servicer import DevicePluginServicer, add_to_server
from hetero_dp.kits import observe
from hetero_dp.kits.aiotools import cancel_and_wait, wait_event
from hetero_dp.kits.decoding import DecodeGuard
from hetero_dp.kits.sockets import (
    bind_unix,
    check_socket_path,
    claim_socket_path,
    remove_own_socket,
    remove_stale_sockets,
    socket_in_use,
)
from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import KUBELET_SOCKET, socket_name

log = logging.getLogger(__name__)

# How long a stop lets calls in flight (an Allocate) finish; the server stops as soon
# as none is left, so an idle instance does not wait at all.
STOP_GRACE = 5.0
# How long a stop waits for the tasks it cancelled (registration, stream watchdog).
# They check a stop condition after every wait and end at once; the bound only
# keeps a stop from hanging should one not (wait_for on CPython
# 3.10/3.11 can swallow a cancellation: docs/sources.md#asyncio-wait-for).
TASK_STOP_TIMEOUT = 2.0
# How long stop() waits for a restart in progress before cancelling it.
SUPERVISOR_STOP_TIMEOUT = 4.0
# After a stream the kubelet had open ends, how long to wait for a new one before
# registering again: a kubelet that replaced our endpoint opens the next stream at
# once, so a short wait is enough and keeps capacity from sitting at zero.
LOST_STREAM_GRACE = 1.0
# Re-registering after the kubelet ended our stream while it is up: the first time at
# once (a hand-over between instances); when it happens again within STABLE_STREAM of
# registering, with a delay doubling from HANDOVER_BACKOFF to HANDOVER_MAX_BACKOFF
# (a kubelet that keeps dropping us gets at most one Register a second).
STABLE_STREAM = 10.0
HANDOVER_BACKOFF = 0.05
HANDOVER_MAX_BACKOFF = 1.0


class PluginEndpoint:
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
        self._server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._restart_wanted = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._changing = False
        self._running = False
        self._servicer: DevicePluginServicer | None = None
        # (device, inode) of each socket file we bound: only those are ours to remove
        self._bound: dict[Path, tuple[int, int] | None] = {}
        self._quick_losses = 0  # streams the kubelet ended soon after we registered
        # streams_opened when the last registration began: a stream opened after it
        # answers that registration, even one that has ended already
        self._opened_base = 0
        # Bumped by every server stop: a registration or watchdog task started for an
        # older server sees the change after its next wait and ends.
        self._generation = 0
        check_socket_path(self.socket_path)
        if self.registry_socket is not None:
            check_socket_path(self.registry_socket)

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

    async def _start_server(self) -> None:
        self._changing = True
        try:
            res = self.resource
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            if claim_socket_path(self.socket_path, "socketPrefix"):
                log.info("removed stale socket %s", self.socket_path, extra={"resource": res.name})
            res.state.reopen()
            servicer = DevicePluginServicer(res)
            server = grpc.aio.server()
            add_to_server(servicer, server)  # undecodable requests: INVALID_ARGUMENT
            self._bound[self.socket_path] = bind_unix(server, self.socket_path)
            await server.start()
            self._server = server
            self._servicer = servicer
            self._opened_base = res.streams_opened
            if self.mode == "watcher":
                await self._start_registry_server()
            else:
                reason = "restart" if self.restarts else "start"
                self._spawn_register(reason)
        finally:
            self._changing = False
        if self._running and not self.socket_path.exists():
            # deleted while we bound it: the daemon ignores deletions while we change,
            # and the kubelet could never dial back to it
            self.request_restart(f"socket {self.socket_name} deleted while starting")

    async def _start_registry_server(self) -> None:
        assert self.registry_socket is not None and self.registry_dir is not None
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        claim_socket_path(self.registry_socket, "socketPrefix")
        reg = grpc.aio.server(interceptors=[DecodeGuard()])  # bad bodies: INVALID_ARGUMENT
        reg_grpc.add_RegistrationServicer_to_server(
            WatcherRegistrationServicer(self.resource.name, str(self.socket_path), self._on_status),
            reg,
        )
        self._bound[self.registry_socket] = bind_unix(reg, self.registry_socket)
        await reg.start()
        self._reg_server = reg

    def _on_status(self, registered: bool, error: str) -> None:
        res = self.resource
        if registered:
            self._registered("watcher", "restart" if self.restarts else "start", self._generation)
        else:
            res.registered = False
            log.error("kubelet refused registration: %s", error, extra={"resource": res.name})
            observe.emit("registration_failed", resource=res.name, reason=error)

    def _bound_paths(self) -> list[tuple[Path, grpc.aio.Server | None]]:
        paths: list[tuple[Path, grpc.aio.Server | None]] = [(self.socket_path, self._server)]
        if self.registry_socket is not None:
            paths.append((self.registry_socket, self._reg_server))
        return paths

    def _stale(self, generation: int) -> bool:
        """True once the server a task was started for is stopping or gone."""
        return not self._running or generation != self._generation or self.resource.state.closed

    def _registered(self, mode: str, reason: str, generation: int) -> None:
        res = self.resource
        if res.state.closed:  # the answer came as the server stops: it is void
            return
        res.registered = True
        log.info(
            "registered with the kubelet (%s mode, %s) as %s",
            mode,
            reason,
            self.socket_name,
            extra={"resource": res.name},
        )
        observe.emit(
            "registered", resource=res.name, mode=mode, reason=reason, socket=str(self.socket_path)
        )
        self._tasks.append(
            asyncio.get_running_loop().create_task(
                self._watch_stream(generation, self._opened_base), name=f"watchdog {res.name}"
            )
        )

    def _spawn_register(self, reason: str) -> None:
        assert self._servicer is not None
        self._tasks.append(
            asyncio.get_running_loop().create_task(
                self._register(self._servicer, self._generation, reason),
                name=f"register {self.resource.name}",
            )
        )

    async def _register(
        self, servicer: DevicePluginServicer, generation: int, reason: str = "start"
    ) -> None:
        res = self.resource

        def failed(reason: str) -> None:
            observe.emit("registration_failed", resource=res.name, reason=reason)

        self._opened_base = res.streams_opened
        attempts = await register_with_backoff(
            self.plugin_dir / KUBELET_SOCKET,
            self.socket_name,
            res.name,
            servicer.options(),
            self.kubelet_appeared,
            failed,
            stopping=lambda: self._stale(generation),
        )
        if attempts is None or self._stale(generation):
            return
        self._registered("classic", reason, generation)

    async def _wait_streams(self, want_open: bool, timeout: float | None) -> bool:
        res = self.resource
        return await self._wait_until(lambda: (res.open_streams > 0) == want_open, timeout)

    async def _wait_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``done()`` holds, re-checked on every stream open and close."""
        res = self.resource
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not done():
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            res.streams_changed.clear()  # no await since the check: no change is missed
            await wait_event(res.streams_changed, remaining)
            if not self._running or res.state.closed:
                return False
        return True

    async def _watch_stream(self, generation: int, opened_base: int) -> None:
        """After registration the kubelet must open ListAndWatch and keep it open;
        when it does not, re-register rather than sit at zero capacity. A stream that
        opened and already closed again before this task ran counts as opened (the
        kubelet can disconnect us right after registering)."""
        res = self.resource
        loop = asyncio.get_running_loop()
        if not await self._wait_until(
            lambda: res.streams_opened > opened_base, self.stream_timeout
        ):
            if not self._running or res.state.closed:
                return
            log.warning(
                "kubelet opened no ListAndWatch stream within %.1fs of registering; re-registering",
                self.stream_timeout,
                extra={"resource": res.name},
            )
            self.request_restart("no ListAndWatch stream after registration")
            return
        opened = loop.time()
        await self._wait_until(lambda: res.open_streams == 0, None)
        if self._stale(generation):
            return
        if self.mode == "classic" and socket_in_use(self.plugin_dir / KUBELET_SOCKET):
            await self._hand_over(generation, loop.time() - opened)
            return
        grace = min(self.stream_timeout, LOST_STREAM_GRACE)
        if not await self._wait_streams(True, grace):
            if not self._running or res.state.closed:
                return
            log.warning(
                "the kubelet's ListAndWatch stream ended and none reopened within %.1fs; "
                "re-registering",
                grace,
                extra={"resource": res.name},
            )
            self.request_restart("ListAndWatch stream lost")

    async def _hand_over(self, generation: int, lasted: float) -> None:
        """The kubelet ended our stream while it is up: register again, at once the
        first time. kubelet 1.32 disconnects a resource's current client whenever any
        client's stream of that resource ends (handler.go ``runClient`` ->
        ``getClient(name)`` -> ``disconnectClient``; manager.go ``PluginDisconnected``
        marks every device unhealthy): an older instance leaving after we registered
        ends its stream and takes ours down, and only an immediate Register brings the
        devices back. Losses in a row soon after registering back off."""
        res = self.resource
        self._quick_losses = 1 if lasted >= STABLE_STREAM else self._quick_losses + 1
        delay = 0.0
        if self._quick_losses > 1:
            delay = min(HANDOVER_BACKOFF * 2 ** (self._quick_losses - 2), HANDOVER_MAX_BACKOFF)
        log.info(
            "the kubelet ended our ListAndWatch stream while it is up (another instance "
            "of this resource left, or the kubelet dropped us); registering again%s",
            f" in {delay:.2f}s ({self._quick_losses} losses in a row)" if delay else " now",
            extra={"resource": res.name},
        )
        if delay > 0 and await self._wait_streams(True, delay):
            # the kubelet opened a stream again meanwhile: watch that one
            self._tasks.append(
                asyncio.get_running_loop().create_task(
                    self._watch_stream(generation, res.streams_opened - 1),
                    name=f"watchdog {res.name}",
                )
            )
            return
        if self._stale(generation):
            return
        self._spawn_register("handover")

    async def _stop_server(self) -> None:
        self._changing = True
        self._generation += 1
        try:
            res = self.resource
            res.registered = False
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
            # A registration that completes while we wait here starts a stream watchdog;
            # loop until no task is left, or stopping waits out that watchdog's timeout.
            # Each wait is bounded: a task that swallowed its cancellation still ends at
            # its next stop check (the generation changed), and is not waited for here.
            while self._tasks:
                tasks, self._tasks = self._tasks, []
                left = await cancel_and_wait(tasks, TASK_STOP_TIMEOUT)
                if left:
                    log.error(
                        "tasks %s did not end within %.0fs of being cancelled; going on",
                        left,
                        TASK_STOP_TIMEOUT,
                        extra={"resource": res.name},
                    )
            if stopping is None:
                stopping = asyncio.gather(*(s.stop(STOP_GRACE) for s in servers))
            await stopping
            self._server = self._reg_server = None
            for path in bound:
                remove_own_socket(path, self._bound.pop(path, None))
        finally:
            self._changing = False
