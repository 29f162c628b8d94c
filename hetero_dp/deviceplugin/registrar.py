"""Registering one resource's server with the kubelet, and keeping it registered.

Classic mode sends ``Register`` with retries and back-off
(:func:`~hetero_dp.deviceplugin.registration.register_with_backoff`); watcher mode
hears the kubelet's verdict through the registration socket. Either way a
registration starts a stream watchdog (:mod:`.streamwatch`), which registers again
on a hand-over and asks for a restart when the kubelet keeps no stream open.

Every server the endpoint starts is a generation: :meth:`Registrar.invalidate` (as
the server stops) moves on to the next, and a registration or watchdog task started
for an older server sees the change after its next wait and ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from hetero_dp.deviceplugin.contract import ServedResource, Session
from hetero_dp.deviceplugin.registration import register_with_backoff
from hetero_dp.deviceplugin.servicer import DevicePluginServicer
from hetero_dp.deviceplugin.streamwatch import StreamWatch
from hetero_dp.kits import observe
from hetero_dp.kits.aiotools import cancel_and_wait

log = logging.getLogger(__name__)

# How long a stop waits for the tasks it cancelled (registration, stream watchdog).
# They check a stop condition after every wait and end at once; the bound only
# keeps a stop from hanging should one not (wait_for on CPython
# 3.10/3.11 can swallow a cancellation: docs/sources.md#asyncio-wait-for).
TASK_STOP_TIMEOUT = 2.0


class Registrar:
    """The registrations of one resource's servers, one generation per server.

    ``running()`` is false once the endpoint stops; ``request_restart(reason)`` asks
    it for a stop-then-start; ``stream_timeout()`` is how long the kubelet may take to
    open ListAndWatch after a registration (read at each registration: a reload may
    change it)."""

    def __init__(
        self,
        resource: ServedResource,
        session: Session,
        *,
        kubelet_socket: Path,
        socket_name: str,
        socket_path: Path,
        classic: bool,
        kubelet_appeared: asyncio.Event,
        stream_timeout: Callable[[], float],
        running: Callable[[], bool],
        request_restart: Callable[[str], None],
    ) -> None:
        self.resource = resource
        self.session = session
        self.kubelet_socket = kubelet_socket
        self.socket_name = socket_name
        self.socket_path = socket_path
        self.kubelet_appeared = kubelet_appeared
        self.running = running
        self.generation = 0
        self.tasks: list[asyncio.Task[None]] = []
        self.servicer: DevicePluginServicer | None = None
        # streams_opened when the last registration began: a stream opened after it
        # answers that registration, even one that has ended already
        self.opened_base = 0
        self.watch = StreamWatch(
            resource,
            session,
            kubelet_socket=kubelet_socket,
            classic=classic,
            stream_timeout=stream_timeout,
            running=running,
            stale=self.stale,
            keep=self.keep,
            register_again=lambda generation: self.register("handover"),
            request_restart=request_restart,
        )

    def stale(self, generation: int) -> bool:
        """True once the server a task was started for is stopping or gone."""
        return not self.running() or generation != self.generation or self.resource.state.closed

    def keep(self, task: asyncio.Task[None]) -> None:
        """A task of this generation's server, cancelled by :meth:`cancel_tasks`."""
        self.tasks.append(task)

    def begin(self, servicer: DevicePluginServicer) -> None:
        """A new server answers with ``servicer``: streams opened from now on answer
        its registration."""
        self.servicer = servicer
        self.opened_base = self.session.streams_opened

    def register(self, reason: str) -> None:
        """Send ``Register`` (classic mode) in a task, retrying with back-off."""
        assert self.servicer is not None
        self.keep(
            asyncio.get_running_loop().create_task(
                self._register(self.servicer, self.generation, reason),
                name=f"register {self.resource.name}",
            )
        )

    async def _register(self, servicer: DevicePluginServicer, generation: int, reason: str) -> None:
        res = self.resource

        def failed(reason: str) -> None:
            observe.emit("registration_failed", resource=res.name, reason=reason)

        self.opened_base = self.session.streams_opened
        attempts = await register_with_backoff(
            self.kubelet_socket,
            self.socket_name,
            res.name,
            servicer.options(),
            self.kubelet_appeared,
            failed,
            stopping=lambda: self.stale(generation),
        )
        if attempts is None or self.stale(generation):
            return
        self.registered("classic", reason, generation)

    def on_status(self, registered: bool, error: str, reason: str) -> None:
        """Watcher mode: the kubelet's verdict on the registration socket."""
        res = self.resource
        if registered:
            self.registered("watcher", reason, self.generation)
        else:
            self.session.registered = False
            log.error("kubelet refused registration: %s", error, extra={"resource": res.name})
            observe.emit("registration_failed", resource=res.name, reason=error)

    def registered(self, mode: str, reason: str, generation: int) -> None:
        res = self.resource
        if res.state.closed:  # the answer came as the server stops: it is void
            return
        self.session.registered = True
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
        self.keep(self.watch.start(generation, self.opened_base))

    def invalidate(self) -> None:
        """The server is stopping: it is registered no more, and the tasks started
        for it end at their next check."""
        self.generation += 1
        self.session.registered = False

    async def cancel_tasks(self) -> None:
        """Cancel this server's tasks and wait for them. A registration that completes
        meanwhile starts a stream watchdog: loop until no task is left, or stopping
        waits out that watchdog's timeout. Each wait is bounded: a task that swallowed
        its cancellation still ends at its next stop check (the generation changed),
        and is not waited for here."""
        while self.tasks:
            tasks, self.tasks = self.tasks, []
            left = await cancel_and_wait(tasks, TASK_STOP_TIMEOUT)
            if left:
                log.error(
                    "tasks %s did not end within %.0fs of being cancelled; going on",
                    left,
                    TASK_STOP_TIMEOUT,
                    extra={"resource": self.resource.name},
                )
