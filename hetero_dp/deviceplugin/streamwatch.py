"""Watching the kubelet's ListAndWatch stream after a registration, and the hand-over.

After registering, the kubelet must open ListAndWatch and keep it open. When it
opens none, or the stream ends and none reopens, the endpoint restarts. When the
kubelet ends our stream while the kubelet itself is up (its socket answers), we
register again at once: the kubelet 1.32 device manager disconnects the current
client of a resource whenever any client's stream ends
(``pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go`` ``runClient``), which is
us when an older instance of the same resource leaves after we registered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from hetero_dp.deviceplugin.contract import ServedResource, Session
from hetero_dp.kits.aiotools import wait_event
from hetero_dp.kits.sockets import socket_in_use

log = logging.getLogger(__name__)

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


class StreamWatch:
    """The stream watchdog of one resource's registrations, and its hand-over policy.

    ``stale(generation)`` tells a watchdog its server is stopping or gone; it then ends
    without acting. ``keep(task)`` hands a task to whoever cancels them when the server
    stops; ``register_again(generation)`` sends a new Register for that server;
    ``request_restart(reason)`` asks the endpoint for a stop-then-start."""

    def __init__(
        self,
        resource: ServedResource,
        session: Session,
        *,
        kubelet_socket: Path,
        classic: bool,
        stream_timeout: Callable[[], float],
        running: Callable[[], bool],
        stale: Callable[[int], bool],
        keep: Callable[[asyncio.Task[None]], None],
        register_again: Callable[[int], None],
        request_restart: Callable[[str], None],
    ) -> None:
        self.resource = resource
        self.session = session
        self.kubelet_socket = kubelet_socket
        self.classic = classic
        self.stream_timeout = stream_timeout
        self.running = running
        self.stale = stale
        self.register_again = register_again
        self.request_restart = request_restart
        self.keep = keep
        self.quick_losses = 0  # streams the kubelet ended soon after we registered

    def start(self, generation: int, opened_base: int) -> asyncio.Task[None]:
        """A watchdog task for the registration of server ``generation``; a stream
        opened after ``opened_base`` answers that registration."""
        return asyncio.get_running_loop().create_task(
            self.watch(generation, opened_base), name=f"watchdog {self.resource.name}"
        )

    def _gone(self) -> bool:
        return not self.running() or self.resource.state.closed

    async def _wait_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``done()`` holds, re-checked on every stream open and close."""
        session = self.session
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not done():
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            session.streams_changed.clear()  # no await since the check: no change is missed
            await wait_event(session.streams_changed, remaining)
            if self._gone():
                return False
        return True

    async def _wait_streams(self, want_open: bool, timeout: float | None) -> bool:
        session = self.session
        return await self._wait_until(lambda: (session.open_streams > 0) == want_open, timeout)

    async def watch(self, generation: int, opened_base: int) -> None:
        """After registration the kubelet must open ListAndWatch and keep it open;
        when it does not, re-register rather than sit at zero capacity. A stream that
        opened and already closed again before this task ran counts as opened (the
        kubelet can disconnect us right after registering)."""
        res = self.resource
        loop = asyncio.get_running_loop()
        timeout = self.stream_timeout()
        session = self.session
        if not await self._wait_until(lambda: session.streams_opened > opened_base, timeout):
            if self._gone():
                return
            log.warning(
                "kubelet opened no ListAndWatch stream within %.1fs of registering; re-registering",
                timeout,
                extra={"resource": res.name},
            )
            self.request_restart("no ListAndWatch stream after registration")
            return
        opened = loop.time()
        await self._wait_until(lambda: session.open_streams == 0, None)
        if self.stale(generation):
            return
        if self.classic and socket_in_use(self.kubelet_socket):
            await self.hand_over(generation, loop.time() - opened)
            return
        grace = min(self.stream_timeout(), LOST_STREAM_GRACE)
        if not await self._wait_streams(True, grace):
            if self._gone():
                return
            log.warning(
                "the kubelet's ListAndWatch stream ended and none reopened within %.1fs; "
                "re-registering",
                grace,
                extra={"resource": res.name},
            )
            self.request_restart("ListAndWatch stream lost")

    def handover_delay(self, lasted: float) -> float:
        """Count a stream that lasted ``lasted`` s as lost; the wait before registering
        again: none the first time, then doubling while losses come in a row."""
        self.quick_losses = 1 if lasted >= STABLE_STREAM else self.quick_losses + 1
        if self.quick_losses <= 1:
            return 0.0
        return min(HANDOVER_BACKOFF * 2 ** (self.quick_losses - 2), HANDOVER_MAX_BACKOFF)

    async def hand_over(self, generation: int, lasted: float) -> None:
        """The kubelet ended our stream while it is up: register again, at once the
        first time. kubelet 1.32 disconnects a resource's current client whenever any
        client's stream of that resource ends (handler.go ``runClient`` ->
        ``getClient(name)`` -> ``disconnectClient``; manager.go ``PluginDisconnected``
        marks every device unhealthy): an older instance leaving after we registered
        ends its stream and takes ours down, and only an immediate Register brings the
        devices back. Losses in a row soon after registering back off."""
        res = self.resource
        delay = self.handover_delay(lasted)
        log.info(
            "the kubelet ended our ListAndWatch stream while it is up (another instance "
            "of this resource left, or the kubelet dropped us); registering again%s",
            f" in {delay:.2f}s ({self.quick_losses} losses in a row)" if delay else " now",
            extra={"resource": res.name},
        )
        if delay > 0 and await self._wait_streams(True, delay):
            # the kubelet opened a stream again meanwhile: watch that one
            self.keep(self.start(generation, self.session.streams_opened - 1))
            return
        if self.stale(generation):
            return
        self.register_again(generation)
