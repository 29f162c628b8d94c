"""The stand-in for the API server DRA mode talks to, and the objects it holds.

:class:`FakeAPIServer` is a **stand-in**, not an API server: a small real HTTP
server (so the official ``kubernetes`` client talks to it over the wire) that
serves only the endpoints DRA mode uses, for the versions it is told to serve:

- ``GET /apis/resource.k8s.io/{v}/namespaces/{ns}/resourceclaims/{name}``
- ``GET|POST /apis/resource.k8s.io/{v}/resourceslices`` (``fieldSelector`` on
  ``spec.driver``, ``spec.nodeName``, ``spec.pool.name``; ``limit`` ignored;
  ``watch=true`` streams ADDED/MODIFIED/DELETED events, one JSON object per
  chunk, from ``resourceVersion``, ending after ``timeoutSeconds``; with
  ``allowWatchBookmarks=true`` also BOOKMARK events, see below)
- ``GET /apis/resource.k8s.io`` (the group's discovery document) and
  ``GET /api/v1/nodes/{name}``
- ``GET|PUT|DELETE /apis/resource.k8s.io/{v}/resourceslices/{name}``

Slices are validated as the real server validates them: the JSON schema of
Kubernetes 1.34 (``kubernetes-validate``, strict, so ``basic`` under ``v1`` is
refused) and the server's own rules from
:mod:`hetero_dp.dra.validation` (the code the publisher checks with, written
from Kubernetes' ``validation.go``): lengths in bytes, names, counts per
device and slice, taints, counters. A refusal is a 422 ``Status`` naming the
field; a number beyond int64 is a 400, as the real server's decoder fails
before validation. Stored objects look as the real server keeps them:
quantities in canonical form (``16384Mi`` comes back as ``16Gi``), empty
fields omitted, fields of feature gates not in ``features`` dropped, one
storage version converted to whichever version is asked (``v1``/``v1beta1``),
and :meth:`FakeAPIServer.serve` changes the served versions at run time (an
upgrade). It keeps no admission, no authentication and no field managers.

Watch history, as the real server keeps it (Kubernetes docs, "API Concepts":
*Efficient detection of changes*, *Watch bookmarks*; the watch cache,
``staging/src/k8s.io/apiserver/pkg/storage/cacher/watch_cache.go``): only the
last ``history`` changes are kept; a watch from an older ``resourceVersion``
gets ``410 Gone`` (reason ``Expired``, "too old resource version"), as an
``ERROR`` event in a 200 stream (what the watch cache sends) or, with
``expired_as="status"``, as the answer's status. A server stopped and started
again (:meth:`stop`, :meth:`start`: same port, same objects, as after an API
server restart) rebuilds its watch cache from storage, so every watch from a
``resourceVersion`` older than the current one expires. Bookmarks (only for a
watch that asks, ``allowWatchBookmarks=true``) carry the current
``resourceVersion`` every ``bookmark_interval`` seconds (the cacher's
``bookmarkFrequency``, a minute) and once shortly before the watch's
``timeoutSeconds`` end, so the client resumes from there. :meth:`verbs` counts
the requests by verb (LIST, WATCH, GET, CREATE, UPDATE, DELETE, ...) and
``connections`` the connections accepted. Guessed, not checked against a real
server: the exact wording of messages beyond the field path and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hetero_dp.dra.api import forget_served
from hetero_dp.dra.client import ClusterConfig, KubeClient
from hetero_dp.dra.features import forget_probes
from hetero_dp.dra.validation import INT64_MAX, INT64_MIN, canonical_quantity, prune_empty, unwrap
from hetero_dp.dra.validation import slice_problems as server_slice_problems

GROUP = "resource.k8s.io"
SCHEMA_VERSION = "1.34"
WATCH_POLL = 0.2  # how often a watch stream checks that its client is still there

FEATURES = ("DRADeviceTaints", "DRAPartitionableDevices", "DRAConsumableCapacity")


def slice_problems(
    obj: dict[str, Any],
    version: str,
    schema: str = SCHEMA_VERSION,
    features: Sequence[str] | None = None,
) -> list[str]:
    """What the API server would refuse in a ResourceSlice (``field: reason`` lines).

    The JSON schema of Kubernetes ``schema`` (with ``kubernetes-validate``,
    strict), then the server's own rules, from the one implementation the
    publisher uses too (:func:`hetero_dp.dra.validation.slice_problems`).
    """
    problems: list[str] = []
    try:
        import kubernetes_validate  # dev dependency; the semantic checks below need none

        try:
            kubernetes_validate.validate(obj, schema, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in getattr(e, "path", [])) or "<root>"
            first = str(getattr(e, "message", e)).splitlines()[0]
            problems.append(f"{path}: {first}")
    except ImportError:
        pass
    if features is not None:  # the server drops disabled-gate fields before it validates
        obj = _from_v1(_drop_disabled(_to_v1(obj, version), features), version)
    return problems + server_slice_problems(obj, version)


def _int64_problem(value: Any, path: str = "") -> str | None:
    """A JSON number the server's decoder cannot put in an int64 (it answers 400)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        return f"{path or '<root>'}: cannot unmarshal number {value} into Go value of type int64"
    if isinstance(value, dict):
        for k, v in value.items():
            p = _int64_problem(v, f"{path}.{k}" if path else str(k))
            if p:
                return p
    if isinstance(value, list):
        for i, v in enumerate(value):
            p = _int64_problem(v, f"{path}[{i}]")
            if p:
                return p
    return None


def _to_v1(obj: dict[str, Any], version: str) -> dict[str, Any]:
    """Storage form: ``v1`` shape (the real server stores one version and converts)."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/v1"
    spec = out.get("spec") or {}
    if version == "v1beta1" and spec.get("devices"):
        spec["devices"] = [unwrap(d, "v1beta1") for d in spec["devices"]]
    return out


def _from_v1(obj: dict[str, Any], version: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/{version}"
    spec = out.get("spec") or {}
    if version == "v1beta1" and spec.get("devices"):
        spec["devices"] = [
            {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
            for d in spec["devices"]
        ]
    return out


def _drop_disabled(obj: dict[str, Any], features: Sequence[str]) -> dict[str, Any]:
    """The real server's ``dropDisabledFields`` (in place): fields of gates that are off."""
    spec = obj.get("spec") or {}
    if "DRAPartitionableDevices" not in features:
        spec.pop("sharedCounters", None)
    for d in spec.get("devices") or []:
        if "DRADeviceTaints" not in features:
            d.pop("taints", None)
        if "DRAPartitionableDevices" not in features:
            d.pop("consumesCounters", None)
        if "DRAConsumableCapacity" not in features:
            d.pop("allowMultipleAllocations", None)
            for c in (d.get("capacity") or {}).values():
                if isinstance(c, dict):
                    c.pop("requestPolicy", None)
    return obj


def _store_form(obj: dict[str, Any], features: Sequence[str]) -> dict[str, Any]:
    """What the server keeps of a valid v1-shaped slice.

    Fields of disabled feature gates are dropped silently (the real server's
    ``dropDisabledFields``: DRADeviceTaints -> ``taints``, DRAPartitionableDevices
    -> ``sharedCounters``/``consumesCounters``, DRAConsumableCapacity ->
    ``allowMultipleAllocations``/``requestPolicy``), quantities are stored in
    canonical form (``16384Mi`` -> ``16Gi``), empty fields are omitted
    (``omitempty``), and a taint without ``timeAdded`` gets one.
    """
    spec = _drop_disabled(obj, features).get("spec") or {}
    for d in spec.get("devices") or []:
        for c in (d.get("capacity") or {}).values():
            c["value"] = canonical_quantity(c["value"])
        for cc in d.get("consumesCounters") or []:
            for c in (cc.get("counters") or {}).values():
                c["value"] = canonical_quantity(c["value"])
        for t in d.get("taints") or []:
            t.setdefault("timeAdded", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    for cs in spec.get("sharedCounters") or []:
        for c in (cs.get("counters") or {}).values():
            c["value"] = canonical_quantity(c["value"])
    pruned: dict[str, Any] = prune_empty(obj)
    return pruned


@dataclass
class Request:
    method: str
    path: str
    status: int
    auth: str = ""  # the Authorization header, as sent


class FakeAPIServer:
    """``with FakeAPIServer() as api: client = api.client()`` — see the module docstring.

    ``versions``: the resource.k8s.io versions served (``("v1beta1",)`` is a
    1.32-1.33 cluster); :meth:`serve` changes them while running (an upgrade).
    ``features``: the enabled feature gates whose fields are kept (others are
    dropped on write, as the real server does). ``refuse_slices``: when set,
    every slice write is refused with this message and ``refuse_status``: 403
    Forbidden (an admission webhook saying no), or 429/503 (a server shedding load).
    ``requests`` records every call.
    """

    def __init__(
        self,
        versions: Sequence[str] = ("v1", "v1beta1"),
        *,
        features: Sequence[str] = (),
        schema: str = SCHEMA_VERSION,
        port: int = 0,
        history: int = 1000,
        bookmark_interval: float = 60.0,
        expired_as: str = "event",
    ) -> None:
        self.versions = tuple(versions)
        self.port = port
        self.history = history
        self.bookmark_interval = bookmark_interval
        self.expired_as = expired_as  # "event" (an ERROR event) or "status" (HTTP 410)
        self.connections = 0  # connections accepted
        self.restarts = 0
        self._compacted = 0  # watches from a resourceVersion below this expire
        self._open: set[Any] = set()  # connections open now
        self._delivering = threading.Event()  # cleared: watch events are held back
        self._delivering.set()
        self.features = tuple(features)
        self.schema = schema
        self.slices: dict[str, dict[str, Any]] = {}  # name -> object, stored as v1
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}  # name -> Node (core/v1)
        self.refuse_slices: str | None = None
        # with refuse_slices: 403 Forbidden (an admission webhook), or e.g. 503 (an API
        # server shedding load answers 429 or 503, "API Priority and Fairness")
        self.refuse_status = 403
        self.requests: list[Request] = []
        self.events: list[tuple[int, str, dict[str, Any]]] = []  # (rv, type, v1 object)
        self.watches = 0  # watch streams open now
        # a real server never answers resourceVersion "0" (that means "any" in a request)
        self._rv = 1
        self._epoch = 0  # the API server process serving now (serve(..., drain=...))
        self._cut_at = 0.0  # when the draining process cuts its watches
        self._stopping = False
        self._cond = threading.Condition()
        self._httpd: ThreadingHTTPServer | None = None
        self._url = ""
        self._thread: threading.Thread | None = None

    # lifecycle

    def connection_opened(self, connection: Any) -> None:
        """A client connected (kept until :meth:`stop` cuts it, as a server's exit does)."""
        with self._cond:
            self.connections += 1
            self._open.add(connection)

    def connection_closed(self, connection: Any) -> None:
        with self._cond:
            self._open.discard(connection)

    def start(self) -> FakeAPIServer:
        """Serve (again, after :meth:`stop`: on the same port, with the same objects and
        the watch history dropped, as a restarted API server)."""
        server = self
        with self._cond:
            self._stopping = False
            if self._url:  # a restart: the watch cache starts over at the current version
                self.restarts += 1
                self.events.clear()
                # resourceVersions are etcd's, shared by every resource: the rest of the
                # cluster wrote meanwhile (each node's Lease alone renews every 10 s,
                # "Leases" in the Kubernetes docs), so the cache starts past any client's
                self._rv += 1
                self._compacted = self._rv

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def setup(self) -> None:
                super().setup()
                server.connection_opened(self.connection)

            def finish(self) -> None:
                server.connection_closed(self.connection)
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
                    status, payload = server.handle(self.command, self.path, body)
                except ValueError as e:
                    status, payload = 400, _status(400, "BadRequest", f"bad JSON: {e}")
                data = json.dumps(payload).encode()
                # recorded before the answer leaves, so a caller that got its answer
                # always finds its request in ``requests``
                server.record(
                    Request(
                        self.command,
                        self.path,
                        status,
                        str(self.headers.get("Authorization") or ""),
                    )
                )
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        host, port = self._httpd.server_address[:2]
        self.port = int(port)
        if not self._url:
            self._url = f"http://{host!s}:{port}"
            # a new server on a port an earlier one used: not the one this process knew
            forget_served(self._url)
            forget_probes(self._url)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="fake-apiserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: the listening socket closes and every open connection (kept
        alive, or a watch) is cut, as when the API server's process ends."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            open_now = list(self._open)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        for conn in open_now:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The server's URL (still known after :meth:`stop`, for "unreachable" tests)."""
        assert self._url, "start() first"
        return self._url

    def client(self) -> KubeClient:
        """A :class:`~hetero_dp.dra.client.KubeClient` pointed at this server."""
        return KubeClient(ClusterConfig(server=self.url))

    # test-side state

    def serve(self, versions: Sequence[str], *, drain: float | None = None) -> None:
        """Serve other versions from now on (a control-plane upgrade or rollback).

        Stored objects stay and are converted, as on a real server. Without
        ``drain`` a watch of a version no longer served ends at once. With
        ``drain`` (seconds) the switch is a new API server process taking over,
        as a real upgrade presents it: every request from now on reaches the new
        one, whose discovery document (``GET /apis/resource.k8s.io``, an
        ``APIGroup`` listing the served ``versions`` and the ``preferredVersion``:
        Kubernetes docs, "Discovering the Kubernetes API") lists the new
        versions, and whose watch cache starts at the current revision (a watch
        resumed from before the switch gets ``410``, as after :meth:`stop` and
        :meth:`start`). The old process drains: a graceful shutdown waits for the
        requests in flight, watches included, up to a deadline (``http.Server.Shutdown``
        with the apiserver's shutdown timeout; kube-apiserver flags
        ``--shutdown-delay-duration``, ``--shutdown-watch-termination-grace-period``),
        then exits and cuts them. Measured against kube-apiserver 1.36 (issue #28
        point 5): a watch stayed open on the draining server about 65 s, and a
        wipe made meanwhile did not come through it; so here the watches opened
        before the switch deliver nothing more (no events, no bookmarks), still
        end at their own ``timeoutSeconds``, and are cut ``drain`` seconds after
        the switch, without the stream's last chunk, as a process exiting leaves them.
        """
        with self._cond:
            self.versions = tuple(versions)
            if drain is not None:
                self._epoch += 1
                self._cut_at = time.monotonic() + drain
                self.events.clear()
                self._rv += 1
                self._compacted = self._rv
            self._cond.notify_all()

    def end_drain(self) -> None:
        """The draining process exits now: its watches are cut."""
        with self._cond:
            self._cut_at = time.monotonic()
            self._cond.notify_all()

    def add_node(self, name: str) -> dict[str, Any]:
        """A Node object (name and UID only), as every cluster has for its nodes."""
        with self._cond:
            node = self.nodes.setdefault(
                name,
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "uid": str(uuid.uuid4())},
                },
            )
            self._cond.notify_all()
            return copy.deepcopy(node)

    def add_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        meta = claim["metadata"]
        with self._cond:
            self.claims[(meta.get("namespace", "default"), meta["name"])] = copy.deepcopy(claim)
            self._cond.notify_all()
        return claim

    def delete_slice(self, name: str) -> None:
        """Delete a slice behind the driver's back (as an admin or the GC would)."""
        with self._cond:
            obj = self.slices.pop(name, None)
            if obj is not None:
                self._event("DELETED", obj)
            self._cond.notify_all()

    def lose(self, node: str) -> list[str]:
        """Make ``node``'s slices vanish without a watch event, as restoring etcd from a
        backup taken before they were written does (only while stopped). The restore
        is done as the Kubernetes docs ask ("Operating etcd clusters for Kubernetes",
        restoring: ``etcdutl snapshot restore --bump-revision ... --mark-compacted``),
        so the revision moves on and every watch from before it gets 410."""
        assert self._httpd is None, "stop() first: a restore happens with the server down"
        with self._cond:
            names = [n for n, s in self.slices.items() if s["spec"].get("nodeName") == node]
            for n in names:
                del self.slices[n]
            self._rv += 1000
            self._compacted = self._rv
        return names

    def hold_watches(self, held: bool = True) -> None:
        """Hold back watch events (a slow watch: a client's writes may meet a newer
        object than its watch has shown it yet); ``False`` lets them through."""
        if held:
            self._delivering.clear()
        else:
            self._delivering.set()
            with self._cond:
                self._cond.notify_all()

    def wipe_node(self, node: str) -> list[str]:
        """Delete every slice of ``node``, as a starting kubelet does; returns their names.

        (The kubelet's DRA manager deletes the node's ResourceSlices of drivers
        it has no registration for when it starts, by a DeleteCollection on
        ``spec.nodeName``: the outage the issue measured at 5-28 s.)
        """
        with self._cond:
            names = [n for n, s in self.slices.items() if s["spec"].get("nodeName") == node]
            for n in names:
                self._event("DELETED", self.slices.pop(n))
            self._cond.notify_all()
        return names

    def slices_of(
        self, driver: str, node: str | None = None, *, version: str = "v1"
    ) -> list[dict[str, Any]]:
        """The stored slices, as served under ``version``."""
        with self._cond:
            return [
                _from_v1(s, version)
                for s in self.slices.values()
                if s["spec"].get("driver") == driver
                and (node is None or s["spec"].get("nodeName") == node)
            ]

    def devices_of(self, driver: str, node: str | None = None) -> dict[str, dict[str, Any]]:
        """Device name -> device, as stored (``v1`` shape)."""
        out: dict[str, dict[str, Any]] = {}
        for s in self.slices_of(driver, node):
            for d in s["spec"].get("devices") or []:
                out[d["name"]] = d
        return out

    def writes(self) -> list[Request]:
        """The slice writes (POST, PUT, DELETE) received so far; dry runs are not writes."""
        with self._cond:
            return [
                r
                for r in self.requests
                if r.method in ("POST", "PUT", "DELETE")
                and "/resourceslices" in r.path
                and "dryRun=" not in r.path
            ]

    def verbs(self, since: int = 0) -> dict[str, int]:
        """Requests from ``requests[since:]`` by verb, as an audit log names them:
        LIST, WATCH, GET, CREATE, UPDATE, DELETE, DRYRUN (a dry-run create) and
        DISCOVERY; FAILED counts answers of 400 and up as well."""
        counts: dict[str, int] = {}
        with self._cond:
            requests = self.requests[since:]
        for r in requests:
            verb = _verb(r)
            counts[verb] = counts.get(verb, 0) + 1
            if r.status >= 400:
                counts["FAILED"] = counts.get("FAILED", 0) + 1
        return counts

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds, re-checked on every request and change."""

        def wait() -> bool:
            with self._cond:
                return self._cond.wait_for(predicate, timeout)

        if not await asyncio.to_thread(wait):
            raise TimeoutError(f"condition not met within {timeout}s")

    # request handling (runs in the HTTP server's threads)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self._rv)
        self.events.append((self._rv, kind, copy.deepcopy(obj)))
        if len(self.events) > self.history:  # the oldest changes fall out of the window
            dropped = self.events[: len(self.events) - self.history]
            del self.events[: len(dropped)]
            self._compacted = max(self._compacted, dropped[-1][0])

    def _route(self, raw_path: str) -> tuple[str, list[str], dict[str, str]] | None:
        url = urlsplit(raw_path)
        parts = [p for p in url.path.split("/") if p]
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if len(parts) < 4 or parts[:2] != ["apis", GROUP] or parts[2] not in self.versions:
            return None
        return parts[2], parts[3:], query

    def record(self, request: Request) -> None:
        """Note a request answered (``requests``), waking whoever waits on the server."""
        with self._cond:
            self.requests.append(request)
            self._cond.notify_all()

    def is_watch(self, method: str, raw_path: str) -> bool:
        """Whether a request opens a ResourceSlice watch stream (``watch=true``)."""
        route = self._route(raw_path)
        return (
            method == "GET"
            and route is not None
            and route[1] == ["resourceslices"]
            and route[2].get("watch") in ("true", "1")
        )

    @staticmethod
    def _selected(obj: dict[str, Any], query: dict[str, str]) -> bool:
        wanted: dict[str, str] = {}
        for term in filter(None, query.get("fieldSelector", "").split(",")):
            key, _, value = term.partition("=")
            wanted[key.strip()] = value.strip()
        spec = obj["spec"]
        fields = {
            "spec.driver": spec.get("driver"),
            "spec.nodeName": spec.get("nodeName"),
            "spec.pool.name": (spec.get("pool") or {}).get("name"),
        }
        return all(fields.get(k) == v for k, v in wanted.items())

    def serve_watch(self, handler: BaseHTTPRequestHandler) -> None:
        """A watch stream: one JSON event per chunk (``{"type", "object"}``), as the
        real server sends with ``watch=true``; from ``resourceVersion`` on, or an
        ADDED event per object first when none is given; ends after ``timeoutSeconds``.
        From a ``resourceVersion`` older than the history held: ``410 Expired``."""
        route = self._route(handler.path)
        assert route is not None
        version, _, query = route
        timeout = float(query.get("timeoutSeconds") or 1800)
        start = time.monotonic()
        deadline = start + timeout
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        # the cacher sends one shortly before the deadline, so the client resumes from it
        final_bookmark = deadline - min(1.0, timeout / 4)
        next_bookmark = min(start + self.bookmark_interval, final_bookmark)
        since = query.get("resourceVersion")
        with self._cond:
            expired = since not in (None, "", "0") and int(since) < self._compacted
            oldest = self._compacted
        status = 410 if expired and self.expired_as == "status" else 200
        gone = _status(
            410, "Expired", f"too old resource version: {since} ({oldest})"
        )  # the watch cache's wording (watch_cache.go)
        if status == 410:
            data = json.dumps(gone).encode()
            with self._cond:
                self.requests.append(Request("WATCH", handler.path, 410))
                self._cond.notify_all()
            handler.send_response(410)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def write(event: dict[str, Any]) -> None:
            data = json.dumps(event).encode() + b"\n"
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            handler.wfile.flush()

        def send(kind: str, obj: dict[str, Any]) -> None:
            write({"type": kind, "object": _from_v1(obj, version)})

        def bookmark(rv: int) -> None:
            write(
                {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": "ResourceSlice",
                        "apiVersion": f"{GROUP}/{version}",
                        "metadata": {"resourceVersion": str(rv)},
                    },
                }
            )

        with self._cond:
            epoch = self._epoch
            self.requests.append(Request("WATCH", handler.path, 200))
            self.watches += 1
            self._cond.notify_all()
            pending: list[tuple[str, dict[str, Any]]] = []
            if since in (None, "", "0"):
                pending = [("ADDED", o) for o in self.slices.values() if self._selected(o, query)]
                last = self._rv
            else:
                last = int(since)
        try:
            if expired:  # one ERROR event, then the end of the stream
                write({"type": "ERROR", "object": gone})
                pending = []
            while not expired:
                if self._epoch != epoch:  # on a draining process: silent, then cut
                    if _peer_closed(handler.connection) or self._drained(handler, deadline):
                        handler.close_connection = True
                        return
                    continue
                for kind, obj in pending:
                    send(kind, obj)
                now = time.monotonic()
                if bookmarks and now >= next_bookmark:
                    bookmark(last)
                    next_bookmark = (
                        min(now + self.bookmark_interval, final_bookmark)
                        if now < final_bookmark
                        else deadline + 1
                    )
                if _peer_closed(handler.connection):  # the client went away
                    break
                wake = deadline if not bookmarks else min(deadline, next_bookmark)
                with self._cond:
                    self._cond.wait_for(
                        functools.partial(self._watch_wakes, last, version, wake),
                        timeout=min(WATCH_POLL, max(0.0, wake - time.monotonic())),
                    )
                    if self._epoch != epoch:
                        continue
                    if self._stopping or version not in self.versions:
                        break
                    if not self._delivering.is_set():
                        pending = []
                        continue
                    fresh = [e for e in self.events if e[0] > last]
                    if fresh:
                        last = fresh[-1][0]
                    pending = [(k, o) for _, k, o in fresh if self._selected(o, query)]
                    if not fresh and time.monotonic() >= deadline:
                        break
            handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with self._cond:
                self.watches -= 1
                self._cond.notify_all()
        handler.close_connection = True

    def _drained(self, handler: BaseHTTPRequestHandler, deadline: float) -> bool:
        """One wait of a watch on a draining process; True when it was cut (no last
        chunk). At its own deadline it ends as usual (False, and the caller's next
        check ends it)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._stopping or time.monotonic() >= min(self._cut_at, deadline),
                timeout=WATCH_POLL,
            )
            cut = self._stopping or time.monotonic() >= self._cut_at
        if cut:
            with contextlib.suppress(OSError):
                handler.connection.shutdown(socket.SHUT_RDWR)
            handler.close_connection = True
            return True
        if time.monotonic() >= deadline:
            handler.wfile.write(b"0\r\n\r\n")
            handler.close_connection = True
            return True
        return False

    def _watch_wakes(self, last: int, version: str, deadline: float) -> bool:
        return bool(
            self._stopping
            or (self.events and self.events[-1][0] > last and self._delivering.is_set())
            or version not in self.versions
            or time.monotonic() >= deadline
        )

    def handle(self, method: str, raw_path: str, body: Any) -> tuple[int, dict[str, Any]]:
        """Answer one request as the API server would: (HTTP status, JSON body)."""
        parts = [p for p in urlsplit(raw_path).path.split("/") if p]
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4 and method == "GET":
            with self._cond:
                node = self.nodes.get(parts[3])
            if node is None:
                return 404, _status(404, "NotFound", f'nodes "{parts[3]}" not found')
            return 200, copy.deepcopy(node)
        if parts == ["apis", GROUP] and method == "GET":
            return 200, self._discovery()
        route = self._route(raw_path)
        if route is None:
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        version, rest, query = route
        with self._cond:
            try:
                if rest[0] == "namespaces" and len(rest) == 4 and rest[2] == "resourceclaims":
                    if method != "GET":
                        return 405, _status(405, "MethodNotAllowed", method)
                    return self._get_claim(version, rest[1], rest[3])
                if rest[0] == "resourceslices" and len(rest) == 1:
                    if method == "GET":
                        return 200, self._list_slices(version, query)
                    if method == "POST":
                        return self._write_slice(version, None, body, query)
                if rest[0] == "resourceslices" and len(rest) == 2:
                    name = rest[1]
                    if method == "GET":
                        obj = self.slices.get(name)
                        return (
                            (200, _from_v1(obj, version))
                            if obj
                            else _not_found("resourceslices", name)
                        )
                    if method == "PUT":
                        return self._write_slice(version, name, body, query)
                    if method == "DELETE":
                        if name not in self.slices:
                            return _not_found("resourceslices", name)
                        self._event("DELETED", self.slices.pop(name))
                        return 200, _status(200, "", "deleted", success=True)
                return 404, _status(404, "NotFound", f"no handler for {method} {raw_path}")
            finally:
                self._cond.notify_all()

    def _discovery(self) -> dict[str, Any]:
        """The group's discovery document (``APIGroup``), as ``GET /apis/<group>``
        answers it: the served versions, the preferred one first."""
        with self._cond:
            versions = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in self.versions]
        if not versions:
            return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": []}
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": GROUP,
            "versions": versions,
            "preferredVersion": versions[0],
        }

    def _get_claim(self, version: str, ns: str, name: str) -> tuple[int, dict[str, Any]]:
        claim = self.claims.get((ns, name))
        if claim is None:
            return _not_found("resourceclaims", name)
        out = copy.deepcopy(claim)
        out["apiVersion"] = f"{GROUP}/{version}"
        out["kind"] = "ResourceClaim"
        return 200, out

    def _list_slices(self, version: str, query: dict[str, str]) -> dict[str, Any]:
        items = [_from_v1(o, version) for o in self.slices.values() if self._selected(o, query)]
        return {
            "apiVersion": f"{GROUP}/{version}",
            "kind": "ResourceSliceList",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _write_slice(
        self, version: str, name: str | None, body: Any, query: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        query = query or {}
        if not isinstance(body, dict):
            return 400, _status(400, "BadRequest", "body must be a JSON object")
        obj_name = str((body.get("metadata") or {}).get("name") or "")
        if self.refuse_slices is not None:
            reason = {403: "Forbidden", 429: "TooManyRequests", 503: "ServiceUnavailable"}
            code = self.refuse_status
            return code, _status(code, reason.get(code, "InternalError"), self.refuse_slices)
        too_big = _int64_problem(body)
        if too_big:  # the real server's JSON decoder fails before validation: 400, not 422
            return 400, _status(
                400, "BadRequest", f"the body of the request was in an unknown format: {too_big}"
            )
        problems = slice_problems(body, version, self.schema, self.features)
        if name is not None and obj_name != name:
            problems.append(f"metadata.name: Invalid value: {obj_name!r}: does not match URL")
        if problems:
            return 422, _status(
                422,
                "Invalid",
                f'ResourceSlice.{GROUP} "{obj_name}" is invalid: ' + "; ".join(problems),
            )
        existing = self.slices.get(obj_name)
        if query.get("dryRun") == "All":  # validated and shaped, answered, not stored
            obj = _store_form(_to_v1(body, version), self.features)
            return (200 if name else 201), _from_v1(obj, version)
        if name is None and existing is not None:
            return 409, _status(
                409, "AlreadyExists", f'resourceslices.{GROUP} "{obj_name}" already exists'
            )
        if name is not None:
            if existing is None:
                return _not_found("resourceslices", name)
            given = (body.get("metadata") or {}).get("resourceVersion")
            current = existing["metadata"]["resourceVersion"]
            if given and given != current:
                return 409, _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on resourceslices.{GROUP} "{name}": the '
                    "object has been modified; please apply your changes to the latest version",
                )
        self._rv += 1
        obj = _store_form(_to_v1(body, version), self.features)
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._rv)
        meta["uid"] = existing["metadata"]["uid"] if existing else str(uuid.uuid4())
        self.slices[obj_name] = obj
        self._event("MODIFIED" if existing else "ADDED", obj)
        return (200 if name else 201), _from_v1(obj, version)


def _verb(r: Request) -> str:
    url = urlsplit(r.path)
    parts = [p for p in url.path.split("/") if p]
    if r.method == "WATCH":
        return "WATCH"
    if parts == ["apis", GROUP]:
        return "DISCOVERY"
    collection = len(parts) % 2 == 0 if parts[:1] == ["apis"] else len(parts) == 3
    if r.method == "GET":
        return "LIST" if collection else "GET"
    if r.method == "POST":
        return "DRYRUN" if "dryRun=" in url.query else "CREATE"
    return {"PUT": "UPDATE", "DELETE": "DELETE"}.get(r.method, r.method)


def _peer_closed(sock: Any) -> bool:
    """True when the client closed its end (readable with nothing to read)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _status(code: int, reason: str, message: str, *, success: bool = False) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if success else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _not_found(resource: str, name: str) -> tuple[int, dict[str, Any]]:
    return 404, _status(404, "NotFound", f'{resource}.{GROUP} "{name}" not found')


def make_claim(
    name: str,
    results: Iterable[tuple[str, str]],
    *,
    driver: str,
    pool: str,
    namespace: str = "default",
    uid: str | None = None,
    version: str = "v1",
    config: Iterable[tuple[str, Any]] = (),
) -> dict[str, Any]:
    """An allocated ResourceClaim: ``results`` are ``(request, device name)`` pairs.

    ``config``: ``(source, parameters)`` pairs of opaque configuration for
    ``driver`` (source ``FromClass`` or ``FromClaim``), as the scheduler copies
    them into ``status.allocation.devices.config``.
    """
    requests = sorted({r.partition("/")[0] for r, _ in results})
    exactly = "exactly" if version == "v1" else None
    spec_requests = []
    for r in requests:
        item: dict[str, Any] = {"name": r}
        if exactly:
            item["exactly"] = {"deviceClassName": driver}
        else:
            item["deviceClassName"] = driver
        spec_requests.append(item)
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": spec_requests}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": driver, "pool": pool, "device": d}
                        for r, d in results
                    ],
                    "config": [
                        {"source": src, "opaque": {"driver": driver, "parameters": params}}
                        for src, params in config
                    ],
                }
            }
        },
    }
