"""The stand-in API server's HTTP side: routes, the REST dispatch, the handler.

It serves only the endpoints DRA mode uses, for the versions it is told to serve:

- ``GET /apis/resource.k8s.io/{v}/namespaces/{ns}/resourceclaims/{name}``
- ``GET|POST /apis/resource.k8s.io/{v}/resourceslices`` (``fieldSelector`` on
  ``spec.driver``, ``spec.nodeName``, ``spec.pool.name``; ``limit`` ignored;
  ``watch=true`` streams events, see :mod:`.watch`)
- ``GET /apis/resource.k8s.io`` (the group's discovery document) and
  ``GET /api/v1/nodes/{name}``
- ``GET|PUT|DELETE /apis/resource.k8s.io/{v}/resourceslices/{name}``

HTTP/1.1 with keep-alive, as the official ``kubernetes`` client talks it.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Sequence
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


class Served(Protocol):
    """What the handler asks of the server it belongs to."""

    def is_watch(self, method: str, raw_path: str) -> bool: ...
    def serve_watch(self, handler: BaseHTTPRequestHandler) -> None: ...
    def handle(self, method: str, raw_path: str, body: Any) -> tuple[int, dict[str, Any]]: ...
    def record(self, request: Request) -> None: ...


def handler_for(server: Served, transport: HTTPTransport) -> type[BaseHTTPRequestHandler]:
    """A request handler class answering for ``server`` on ``transport``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def setup(self) -> None:
            super().setup()
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

    def __init__(self, server: Served, cond: threading.Condition, port: int = 0) -> None:
        self.server = server
        self.cond = cond
        self.port = port
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

    def connection_closed(self, connection: Any) -> None:
        with self.cond:
            self._open.discard(connection)

    def start(self) -> str:
        """Listen (on ``port``, or a free one the first time) and serve; the URL."""
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler_for(self.server, self))
        self._httpd.daemon_threads = True
        host, port = self._httpd.server_address[:2]
        self.port = int(port)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="fake-apiserver", daemon=True
        )
        self._thread.start()
        return f"http://{host!s}:{port}"

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
