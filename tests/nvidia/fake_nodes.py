"""A minimal Kubernetes API server for Node objects: GET one node, list and watch by
field selector. Facts from the Kubernetes API conventions (api-concepts "Efficient
detection of changes"): a watch is ``GET /api/v1/nodes?watch=true&resourceVersion=N``,
answered as a stream of JSON lines ``{"type": "MODIFIED", "object": <Node>}`` for the
changes after version N; ``timeoutSeconds`` ends it. Only what the config manager
uses is here (no auth, no other kinds, field selector ``metadata.name`` only)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class FakeNodes:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, str]] = {}  # name -> labels
        self.history: list[tuple[int, str]] = []  # (resourceVersion, node name)
        self.version = 1
        self.cond = threading.Condition()
        self.stopping = False
        self.server: ThreadingHTTPServer | None = None

    def node(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": dict(self.nodes[name]),
                "resourceVersion": str(self.version),
            },
        }

    def changed(self, name: str, after: int) -> bool:
        """Stopping, or ``name`` changed after version ``after`` (caller holds cond)."""
        return self.stopping or any(v > after and n == name for v, n in self.history)

    def set_labels(self, name: str, labels: dict[str, str]) -> None:
        with self.cond:
            self.version += 1
            self.nodes[name] = dict(labels)
            self.history.append((self.version, name))
            self.cond.notify_all()

    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # a stream ends when the connection closes

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                parts = [p for p in url.path.split("/") if p]
                if parts[:3] != ["api", "v1", "nodes"]:
                    return self._send(404, {"kind": "Status", "code": 404})
                if len(parts) == 4:
                    with fake.cond:
                        if parts[3] not in fake.nodes:
                            return self._send(404, {"kind": "Status", "code": 404})
                        return self._send(200, fake.node(parts[3]))
                name = query.get("fieldSelector", "").removeprefix("metadata.name=")
                if query.get("watch", "").lower() not in ("true", "1"):
                    with fake.cond:
                        items = [fake.node(name)] if name in fake.nodes else []
                        body = {"kind": "NodeList", "apiVersion": "v1", "items": items}
                        body["metadata"] = {"resourceVersion": str(fake.version)}
                    return self._send(200, body)
                self._watch(name, int(query.get("resourceVersion") or 0))

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _watch(self, name: str, since: int) -> None:
                # As the API server streams a watch: HTTP/1.1, chunked, one event per line.
                self.protocol_version = "HTTP/1.1"
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while True:
                    with fake.cond:
                        fake.cond.wait_for(lambda after=since: fake.changed(name, after))
                        if fake.stopping:
                            self.wfile.write(b"0\r\n\r\n")
                            return
                        since = fake.version
                        event = {"type": "MODIFIED", "object": fake.node(name)}
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
