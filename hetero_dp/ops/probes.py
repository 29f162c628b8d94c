"""One small HTTP server on the daemon's loop: ``/metrics``, ``/healthz``, ``/readyz``.

It runs on the same asyncio loop as everything else on purpose: an answer
from ``/healthz`` proves the loop is alive, which is what a liveness probe
should ask. ``/readyz`` answers 200 only when every resource the daemon serves
is registered with the kubelet and has its ListAndWatch stream open, and every
resource a backend requires (its ``required_resources`` hook) has a device; the body
names each resource that is not, and why (``Daemon.readiness``).

The port may face the node's network (the udev DaemonSet exposes it on the node
IP), so it holds up under pressure: at most :data:`MAX_CONNECTIONS` connections
are open at once (a new one closes the oldest that has not finished sending its
request for :data:`IDLE_GRACE` seconds, so a probe gets through a crowd of idle
clients); a request must arrive
whole within :data:`READ_TIMEOUT` (slow senders too) and the answer leave within
:data:`WRITE_TIMEOUT`; and nothing is logged per connection, only one line per
cause, at most once a minute (issue #36: 1,500 idle clients exhausted the
daemon's descriptors and wrote 12,000-27,000 lines in 35 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from hetero_dp.kits import observe
from hetero_dp.kits.aiotools import with_timeout
from hetero_dp.kits.logs import Repeats
from hetero_dp.model.errors import ConfigError

if TYPE_CHECKING:
    from hetero_dp.engine.daemon import Daemon
    from hetero_dp.ops.metrics import Metrics

log = logging.getLogger(__name__)

READ_TIMEOUT = 5.0  # seconds for a whole request (line and headers)
WRITE_TIMEOUT = 5.0  # seconds for the answer to leave
MAX_CONNECTIONS = 32  # open at once (kits/limits.py counts them in its descriptor need)
# a connection that sent no whole request this long after it was accepted may be
# closed to make room (a probe sends its request at once)
IDLE_GRACE = 0.5
# connections accepted in one go: asyncio accepts up to its listen backlog at each
# wake-up, each a descriptor before its handler runs, and one refused is closed a
# loop turn later; so a burst holds at most the cap and two batches
BACKLOG = 16
PORT_RETRY = 0.25  # how often a taken port is tried again (wait_for_port)
MAX_HEADER_LINES = 100
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
REASONS[503] = "Service Unavailable"

Handler = Callable[[], Awaitable[tuple[int, str, bytes]]]


def parse_address(address: str, field: str = "metrics.address") -> tuple[str | None, int]:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port`` -> (host or None, port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(
            f"expected HOST:PORT or :PORT with a port from 0 to 65535, got {address!r}",
            field=field,
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host in ("", "*"):
        return None, int(port_text)
    return host, int(port_text)


def readiness(daemon: Daemon) -> tuple[bool, list[str]]:
    """(ready, one line per resource) for ``/readyz`` and ``doctor``."""
    return daemon.readiness()  # the front end's: endpoints, or DRA drivers


class ProbeServer:
    """Serves ``/metrics`` (when ``metrics`` is given), ``/healthz`` and ``/readyz``."""

    def __init__(
        self,
        daemon: Daemon,
        address: str,
        metrics: Metrics | None = None,
        *,
        wait_for_port: bool = False,
    ) -> None:
        self.daemon = daemon
        self.address = address
        self.host, self._port = parse_address(address)
        self.metrics = metrics
        self.wait_for_port = wait_for_port
        self._server: asyncio.base_events.Server | None = None
        self._waiting: asyncio.Task[None] | None = None
        self._routes: dict[str, Handler] = {"/healthz": self._healthz, "/readyz": self._readyz}
        # open connections, oldest first -> when accepted while still reading its
        # request (it may be closed to make room), 0.0 while being answered
        self._open: dict[asyncio.StreamWriter, float] = {}
        self.evicted = 0  # idle connections closed to make room for a new one
        self._repeats = Repeats()
        if metrics is not None:
            self._routes["/metrics"] = self._metrics

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        if self._server is not None and self._server.sockets:
            return int(self._server.sockets[0].getsockname()[1])
        return self._port

    @property
    def open_connections(self) -> int:
        """Connections open now (at most :data:`MAX_CONNECTIONS`)."""
        return len(self._open)

    @property
    def serving(self) -> bool:
        """Listening (False while waiting for a port another process holds)."""
        return self._server is not None

    async def start(self) -> None:
        """Listen; with ``wait_for_port``, a port another process holds (the old pod of
        a surge rollout in the host network) is taken in the background once free."""
        try:
            await self._listen()
        except OSError as e:
            if not (self.wait_for_port and e.errno == errno.EADDRINUSE):
                raise ConfigError(
                    f"cannot listen on {self.address}: {e.strerror}", field="metrics.address"
                ) from e
            # Expected in every surge roll of a host-network DaemonSet: INFO, worded so
            # (it read like a fault as a WARNING, issue 37). A port that never frees
            # shows as /metrics never served by this instance, not as this line.
            log.info(
                "%s is held by another process, as expected during a rolling update "
                "(the old pod this one replaces); serving the device plugin now and "
                "/metrics, /healthz and /readyz there once the old pod releases the port "
                "(metrics.waitForPort)",
                self.address,
            )
            self._waiting = asyncio.get_running_loop().create_task(self._wait_for_port())

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self.host, self._port, backlog=BACKLOG
        )
        log.info("serving /metrics, /healthz and /readyz on %s (port %d)", self.address, self.port)
        observe.emit("probe_server", address=self.address, port=self.port)

    async def _wait_for_port(self) -> None:
        while True:
            await asyncio.sleep(PORT_RETRY)
            try:
                await self._listen()
                return
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    log.error("cannot listen on %s: %s; not serving it", self.address, e.strerror)
                    return

    async def stop(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
        for writer in list(self._open):  # their handlers end on their own, not cancelled
            writer.transport.abort()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await with_timeout(self._server.wait_closed(), 2)
            self._server = None

    async def _healthz(self) -> tuple[int, str, bytes]:
        return 200, "text/plain; charset=utf-8", b"ok\n"

    async def _readyz(self) -> tuple[int, str, bytes]:
        ok, lines = readiness(self.daemon)
        body = ("\n".join(lines) + "\n").encode()
        return (200 if ok else 503), "text/plain; charset=utf-8", body

    async def _metrics(self) -> tuple[int, str, bytes]:
        # imported here: prometheus_client costs ~10 MiB, paid only when metrics are served
        from prometheus_client import CONTENT_TYPE_LATEST

        assert self.metrics is not None
        return 200, CONTENT_TYPE_LATEST, await self.metrics.render()

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Make room for a new connection: at the cap, the oldest one that has sent no
        whole request for IDLE_GRACE seconds is closed; when there is none (a burst of
        connections, each not yet read from), the new one is."""
        if len(self._open) >= MAX_CONNECTIONS:
            self._once(
                "full",
                "more than %d connections at once on %s: idle ones are closed",
                MAX_CONNECTIONS,
                self.address,
            )
            now = time.monotonic()
            idle = next(
                (w for w, since in self._open.items() if since and now - since > IDLE_GRACE),
                None,
            )
            if idle is None:
                writer.transport.abort()
                return False
            del self._open[idle]
            idle.transport.abort()
            self.evicted += 1
        self._open[writer] = time.monotonic()
        return True

    def _once(self, cause: str, message: str, *args: object) -> None:
        show, left_out = self._repeats.check(cause)
        if show:
            more = f" ({left_out} more since the last line)" if left_out else ""
            log.warning(message + "%s", *args, more)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            return
        try:
            await self._serve(reader, writer)
        finally:
            self._open.pop(writer, None)
            writer.transport.abort()  # closed already, or given up on: nothing lingers

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            # only reading the request is bounded: a slow backend's metrics hook has its own
            request = await with_timeout(self._read_request(reader), READ_TIMEOUT)
        except (asyncio.TimeoutError, ConnectionError, ValueError):
            return
        if writer.transport.is_closing():  # closed to make room meanwhile
            return
        self._open[writer] = 0.0  # being answered: not closed to make room
        try:
            status, ctype, body, head = await self._answer(request)
        except Exception as e:
            show, _ = self._repeats.check(("failed", type(e)))
            log.error("probe request failed: %r", e, exc_info=e if show else None)
            status, ctype, body, head = 500, "text/plain", b"internal error\n", False
        reason = REASONS.get(status, "Error")
        header = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
            writer.write(header.encode() + (b"" if head else body))
            writer.close()  # once the answer has left
            await with_timeout(writer.wait_closed(), WRITE_TIMEOUT)

    async def _read_request(self, reader: asyncio.StreamReader) -> list[str]:
        request = (await reader.readline()).decode("latin-1").split()
        for _ in range(MAX_HEADER_LINES):  # headers are read and ignored
            if (await reader.readline()) in (b"\r\n", b"\n", b""):
                break
        return request

    async def _answer(self, request: list[str]) -> tuple[int, str, bytes, bool]:
        if len(request) != 3:
            return 400, "text/plain", b"bad request\n", False
        method, target, _version = request
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"only GET and HEAD\n", False
        handler = self._routes.get(target.split("?", 1)[0])
        if handler is None:
            paths = ", ".join(sorted(self._routes))
            return 404, "text/plain", f"not found; try {paths}\n".encode(), False
        status, ctype, body = await handler()
        return status, ctype, body, method == "HEAD"
