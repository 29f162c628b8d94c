"""The stand-in API server's HTTP side: routes, the REST dispatch, the handler.

It serves only the endpoints DRA mode uses, for the versions it is told to serve:

- ``GET /apis/resource.k8s.io/{v}/namespaces/{ns}/resourceclaims/{name}``
- ``GET|POST /apis/resource.k8s.io/{v}/resourceslices`` (``fieldSelector`` on
  ``spec.driver``, ``spec.nodeName``, ``spec.pool.name``; ``limit`` ignored;
  ``watch=true`` streams events, see :mod:`.watch`)
- ``GET /apis/resource.k8s.io`` (the group's discovery document) and
  ``GET /api/v1/nodes/{name}``
- ``GET|PUT|DELETE /apis/resource.k8s.io/{v}/resourceslices/{name}``

HTTP/1.1 with keep-alive, as the official ``kubernetes`` client talks it;
over TLS when given a certificate (``tls``), dropping connections idle for
``idle_timeout`` seconds as kube-apiserver does after its ``IdleTimeout``
(90 s), without a TLS ``close_notify`` (issue #36, measured against
kube-apiserver 1.36: the client's next request on such a connection failed
with ``ssl.SSLEOFError``). :class:`Misbehaviour` makes it a hostile server on
purpose (answers trickled a byte at a time, or endless), for the client's
deadlines and caps.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from hetero_dp.testing.dra.apiserver.objects import Request, status
from hetero_dp.testing.dra.apiserver.schema import GROUP
from hetero_dp.testing.dra.apiserver.store import ObjectStore

Route = tuple[str, list[str], dict[str, str]]  # (version, path after it, query)


def route(raw_path: str, versions: Sequence[str]) -> Route | None:
    """A resource.k8s.io path under a served version, split; else None."""
    url = urlsplit(raw_path)
    parts = [p for p in url.path.split("/") if p]
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    if len(parts) < 4 or parts[:2] != ["apis", GROUP] or parts[2] not in versions:
        return None
    return parts[2], parts[3:], query


def discovery(versions: Sequence[str]) -> dict[str, Any]:
    """The group's discovery document (``APIGroup``), as ``GET /apis/<group>``
    answers it: the served versions, the preferred one first."""
    listed = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in versions]
    if not listed:
        return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": []}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": listed,
        "preferredVersion": listed[0],
    }


def answer(
    store: ObjectStore, versions: Sequence[str], method: str, raw_path: str, body: Any
) -> tuple[int, dict[str, Any]]:
    """Answer one request as the API server would: (HTTP status, JSON body)."""
    parts = [p for p in urlsplit(raw_path).path.split("/") if p]
    if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4 and method == "GET":
        return store.get_node(parts[3])
    if parts == ["apis", GROUP] and method == "GET":
        return 200, discovery(versions)
    found = route(raw_path, versions)
    if found is None:
        return 404, status(404, "NotFound", "the server could not find the requested resource")
    version, rest, query = found
    with store.cond:
        try:
            if rest[0] == "namespaces" and len(rest) == 4 and rest[2] == "resourceclaims":
                if method != "GET":
                    return 405, status(405, "MethodNotAllowed", method)
                return store.get_claim(version, rest[1], rest[3])
            if rest[0] == "resourceslices" and len(rest) == 1:
                if method == "GET":
                    return 200, store.list_slices(version, query)
                if method == "POST":
                    return store.write_slice(version, None, body, query)
            if rest[0] == "resourceslices" and len(rest) == 2:
                name = rest[1]
                if method == "GET":
                    return store.get_slice(version, name)
                if method == "PUT":
                    return store.write_slice(version, name, body, query)
                if method == "DELETE":
                    return store.delete_slice(name)
            return 404, status(404, "NotFound", f"no handler for {method} {raw_path}")
        finally:
            store.cond.notify_all()


@dataclass
class Misbehaviour:
    """A hostile server, on purpose (adversarial tests; nothing a real API server does).

    For requests whose method is in ``methods`` (all when empty): with ``trickle``
    (seconds), a ``200`` whose body comes one byte every ``trickle`` seconds and never
    ends (nor ends a line, for a watch); with ``body_bytes``, a ``200`` whose body is
    that many spaces (``chunked``: without a ``Content-Length``), written as fast as
    the client reads. ``sent``: the bytes written so far; ``hit``: set on the
    first request misbehaved at. :meth:`end` ends them all."""

    trickle: float = 0.0
    body_bytes: int = 0
    chunked: bool = False
    methods: frozenset[str] = frozenset()
    sent: int = 0
    hit: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    def applies(self, method: str) -> bool:
        return bool(self.trickle or self.body_bytes) and (
            not self.methods or method in self.methods
        )

    def end(self) -> None:
        self.ended.set()

    def serve(self, wfile: Any) -> None:
        """Misbehave on ``wfile`` until the client goes, the answer ends or :meth:`end`."""
        self.hit.set()
        with contextlib.suppress(OSError, ValueError):
            if self.trickle:  # a whole head, then a body that never ends a line
                wfile.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                wfile.flush()
                while not self.ended.wait(self.trickle):
                    wfile.write(b"1\r\n \r\n")  # one byte, in a chunk of its own
                    wfile.flush()
                    self.sent += 1
                return
            head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            head += (
                "Transfer-Encoding: chunked\r\n\r\n"
                if self.chunked
                else f"Content-Length: {self.body_bytes}\r\n\r\n"
            )
            wfile.write(head.encode())
            block = b" " * (1 << 16)
            left = self.body_bytes
            while left > 0 and not self.ended.is_set():
                piece = block[: min(left, len(block))]
                wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if self.chunked else piece)
                self.sent += len(piece)
                left -= len(piece)


class Served(Protocol):
    """What the handler asks of the server it belongs to."""

    misbehaviour: Misbehaviour

    def is_watch(self, method: str, raw_path: str) -> bool: ...
    def serve_watch(self, handler: BaseHTTPRequestHandler) -> None: ...
    def handle(self, method: str, raw_path: str, body: Any) -> tuple[int, dict[str, Any]]: ...
    def record(self, request: Request) -> None: ...


def handler_for(server: Served, transport: HTTPTransport) -> type[BaseHTTPRequestHandler]:
    """A request handler class answering for ``server`` on ``transport``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = transport.idle_timeout  # waiting for the next request on a connection

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def log_error(self, format: str, *args: Any) -> None:
            # BaseHTTPRequestHandler's words when a connection sat idle past ``timeout``
            if format.startswith("Request timed out"):
                transport.idle_closed()

        def setup(self) -> None:
            super().setup()
            if isinstance(self.connection, ssl.SSLSocket):
                with contextlib.suppress(OSError):
                    self.connection.do_handshake()  # here, not in the accepting thread
            transport.connection_opened(self.connection)

        def finish(self) -> None:
            transport.connection_closed(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            return json.loads(raw) if raw else None

        def _answer(self) -> None:
            if server.misbehaviour.applies(self.command):
                server.misbehaviour.serve(self.wfile)
                self.close_connection = True
                return
            if server.is_watch(self.command, self.path):
                server.serve_watch(self)
                return
            try:
                body = self._body()
                code, payload = server.handle(self.command, self.path, body)
            except ValueError as e:
                code, payload = 400, status(400, "BadRequest", f"bad JSON: {e}")
            data = json.dumps(payload).encode()
            # recorded before the answer leaves, so a caller that got its answer
            # always finds its request in ``requests``
            server.record(
                Request(
                    self.command,
                    self.path,
                    code,
                    str(self.headers.get("Authorization") or ""),
                )
            )
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

    return Handler


class HTTPTransport:
    """The listening socket on 127.0.0.1, its serving thread and the connections open
    (``connections`` counts those accepted); ``cond`` guards them."""

    def __init__(
        self,
        server: Served,
        cond: threading.Condition,
        port: int = 0,
        *,
        tls: tuple[str, str] | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        self.server = server
        self.cond = cond
        self.port = port
        self.tls = tls  # (certificate file, key file), PEM
        self.idle_timeout = idle_timeout
        self.idle_drops = 0  # connections closed for sitting idle
        self.connections = 0  # connections accepted
        self._open: set[Any] = set()  # connections open now
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def serving(self) -> bool:
        return self._httpd is not None

    def connection_opened(self, connection: Any) -> None:
        """A client connected (kept until :meth:`stop` cuts it, as a server's exit does)."""
        with self.cond:
            self.connections += 1
            self._open.add(connection)

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` holds (re-checked on every request, connection
        and change); True if it did within ``timeout`` seconds."""
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    @property
    def open_connections(self) -> int:
        with self.cond:
            return len(self._open)

    def idle_closed(self) -> None:
        with self.cond:
            self.idle_drops += 1
            self.cond.notify_all()

    def connection_closed(self, connection: Any) -> None:
        with self.cond:
            self._open.discard(connection)
            self.cond.notify_all()

    def start(self) -> str:
        """Listen (on ``port``, or a free one the first time) and serve; the URL."""
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler_for(self.server, self))
        self._httpd.daemon_threads = True
        scheme = "http"
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            self._httpd.socket = ctx.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
            scheme = "https"
        host, port = self._httpd.server_address[:2]
        self.port = int(port)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="fake-apiserver", daemon=True
        )
        self._thread.start()
        return f"{scheme}://{host!s}:{port}"

    def stop(self) -> None:
        """The listening socket closes and every open connection (kept alive, or a
        watch) is cut, as when the API server's process ends."""
        with self.cond:
            open_now = list(self._open)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        for conn in open_now:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
