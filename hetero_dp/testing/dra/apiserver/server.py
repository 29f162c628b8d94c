"""The stand-in for the API server DRA mode talks to: :class:`FakeAPIServer`.

A **stand-in**, not an API server: a small real HTTP server (so the driver's
client talks to it over the wire), composed of the pieces in this
package: the routes and handler (:mod:`.transport`), the objects with their
resourceVersions and watch cache (:mod:`.store`), slice validation and storage form
(:mod:`.schema`) and the watch streams (:mod:`.watch`). :meth:`FakeAPIServer.serve`
changes the served versions at run time (an upgrade). A server stopped and started
again (:meth:`~FakeAPIServer.stop`, :meth:`~FakeAPIServer.start`: same port, same
objects, as after an API server restart) rebuilds its watch cache from storage, so
every watch from a ``resourceVersion`` older than the current one expires.
:meth:`~FakeAPIServer.verbs` counts the requests by verb (LIST, WATCH, GET, CREATE,
UPDATE, DELETE, ...) and ``connections`` the connections accepted. Guessed, not
checked against a real server: the exact wording of messages beyond the field path
and reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any

from hetero_dp.dra.api import forget_served
from hetero_dp.dra.client import ClusterConfig, KubeClient
from hetero_dp.dra.features import forget_probes
from hetero_dp.testing.dra.apiserver.objects import Request, RequestLog
from hetero_dp.testing.dra.apiserver.schema import SCHEMA_VERSION
from hetero_dp.testing.dra.apiserver.store import ObjectStore
from hetero_dp.testing.dra.apiserver.transport import (
    HTTPTransport,
    Misbehaviour,
    answer,
    route,
)
from hetero_dp.testing.dra.apiserver.watch import Serving, WatchStreams
from hetero_dp.testing.waiting import wait_on


class FakeAPIServer:
    """``with FakeAPIServer() as api: client = api.client()`` — see the module docstring.

    ``versions``: the resource.k8s.io versions served (``("v1beta1",)`` is a
    1.32-1.33 cluster); :meth:`serve` changes them while running (an upgrade).
    ``features``: the enabled feature gates whose fields are kept (others are
    dropped on write, as the real server does). ``refuse_slices``: when set,
    every slice write is refused with this message and ``refuse_status``: 403
    Forbidden (an admission webhook saying no), or 429/503 (a server shedding load).
    ``requests`` records every call. ``history``, ``bookmark_interval`` and
    ``expired_as``: see :mod:`.store` and :mod:`.watch`; ``tls``, ``idle_timeout``
    and ``misbehaviour`` (a hostile server): see :mod:`.transport`.
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
        tls: tuple[str, str] | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        self.misbehaviour = Misbehaviour()
        self.store = ObjectStore(features=features, schema=schema, history=history)
        self.serving = Serving(tuple(versions))
        self.streams = WatchStreams(
            self.store,
            self.serving,
            self.record,
            bookmark_interval=bookmark_interval,
            expired_as=expired_as,
        )
        self.restarts = 0
        self.log = RequestLog(self.store.cond)
        self._cond = self.store.cond
        self.transport = HTTPTransport(
            self, self.store.cond, port, tls=tls, idle_timeout=idle_timeout
        )
        self._url = ""

    # the pieces' state, under the names tests use

    @property
    def port(self) -> int:
        return self.transport.port

    @property
    def connections(self) -> int:
        return self.transport.connections  # connections accepted

    @property
    def versions(self) -> tuple[str, ...]:
        return self.serving.versions

    @property
    def features(self) -> tuple[str, ...]:
        return self.store.features

    @property
    def schema(self) -> str:
        return self.store.schema

    @property
    def slices(self) -> dict[str, dict[str, Any]]:
        return self.store.slices  # name -> object, stored as v1

    @property
    def claims(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.store.claims

    @property
    def nodes(self) -> dict[str, dict[str, Any]]:
        return self.store.nodes

    @property
    def events(self) -> list[tuple[int, str, dict[str, Any]]]:
        return self.store.events  # (rv, type, v1 object)

    @property
    def requests(self) -> list[Request]:
        return self.log.requests  # every request answered, in order

    @property
    def watches(self) -> int:
        return self.streams.watches  # watch streams open now

    @property
    def refuse_slices(self) -> str | None:
        return self.store.refuse_slices

    @refuse_slices.setter
    def refuse_slices(self, message: str | None) -> None:
        self.store.refuse_slices = message

    @property
    def refuse_status(self) -> int:
        return self.store.refuse_status

    @refuse_status.setter
    def refuse_status(self, code: int) -> None:
        self.store.refuse_status = code

    @property
    def bookmark_interval(self) -> float:
        return self.streams.bookmark_interval

    @bookmark_interval.setter
    def bookmark_interval(self, seconds: float) -> None:
        self.streams.bookmark_interval = seconds

    # lifecycle

    def start(self) -> FakeAPIServer:
        """Serve (again, after :meth:`stop`: on the same port, with the same objects and
        the watch history dropped, as a restarted API server)."""
        with self._cond:
            self.serving.stopping = False
            if self._url:  # a restart: the watch cache starts over at the current version
                self.restarts += 1
                # resourceVersions are etcd's, shared by every resource: the rest of the
                # cluster wrote meanwhile (each node's Lease alone renews every 10 s,
                # "Leases" in the Kubernetes docs), so the cache starts past any client's
                self.store.start_over()
        url = self.transport.start()
        if not self._url:
            self._url = url
            # a new server on a port an earlier one used: not the one this process knew
            forget_served(self._url)
            forget_probes(self._url)
        return self

    def stop(self) -> None:
        """Stop serving: the listening socket closes and every open connection (kept
        alive, or a watch) is cut, as when the API server's process ends."""
        with self._cond:
            self.serving.stopping = True
            self._cond.notify_all()
        self.misbehaviour.end()
        self.transport.stop()

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
        """A :class:`~hetero_dp.dra.client.KubeClient` pointed at this server (trusting
        its certificate, over TLS)."""
        tls = self.transport.tls
        return KubeClient(ClusterConfig(server=self.url, ca_file=tls[0] if tls else ""))

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
            self.serving.versions = tuple(versions)
            if drain is not None:
                self.serving.epoch += 1
                self.serving.cut_at = time.monotonic() + drain
                self.store.start_over()
            self._cond.notify_all()

    def end_drain(self) -> None:
        """The draining process exits now: its watches are cut."""
        with self._cond:
            self.serving.cut_at = time.monotonic()
            self._cond.notify_all()

    def add_node(self, name: str) -> dict[str, Any]:
        """A Node object (name and UID only), as every cluster has for its nodes."""
        return self.store.add_node(name)

    def add_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        return self.store.add_claim(claim)

    def delete_slice(self, name: str) -> None:
        """Delete a slice behind the driver's back (as an admin or the GC would)."""
        self.store.delete_slices([name])

    def lose(self, node: str) -> list[str]:
        """Make ``node``'s slices vanish without a watch event, as restoring etcd from a
        backup taken before they were written does (only while stopped). The restore
        is done as the Kubernetes docs ask ("Operating etcd clusters for Kubernetes",
        restoring: ``etcdutl snapshot restore --bump-revision ... --mark-compacted``),
        so the revision moves on and every watch from before it gets 410."""
        assert not self.transport.serving, "stop() first: a restore happens with the server down"
        with self._cond:
            names = self.store.slice_names_of(node)
            self.store.delete_slices(names, silently=True)
            self.store.compact(1000)
        return names

    def hold_watches(self, held: bool = True) -> None:
        """Hold back watch events (a slow watch: a client's writes may meet a newer
        object than its watch has shown it yet); ``False`` lets them through."""
        if held:
            self.serving.delivering.clear()
        else:
            self.serving.delivering.set()
            with self._cond:
                self._cond.notify_all()

    def wipe_node(self, node: str) -> list[str]:
        """Delete every slice of ``node``, as a starting kubelet does; returns their names.

        (The kubelet's DRA manager deletes the node's ResourceSlices of drivers
        it has no registration for when it starts, by a DeleteCollection on
        ``spec.nodeName``: the outage the issue measured at 5-28 s.)
        """
        with self._cond:
            names = self.store.slice_names_of(node)
            self.store.delete_slices(names)
        return names

    def slices_of(
        self, driver: str, node: str | None = None, *, version: str = "v1"
    ) -> list[dict[str, Any]]:
        """The stored slices, as served under ``version``."""
        return self.store.slices_of(driver, node, version=version)

    def devices_of(self, driver: str, node: str | None = None) -> dict[str, dict[str, Any]]:
        """Device name -> device, as stored (``v1`` shape)."""
        return self.store.devices_of(driver, node)

    def writes(self) -> list[Request]:
        """See :meth:`RequestLog.writes`."""
        return self.log.writes()

    def verbs(self, since: int = 0) -> dict[str, int]:
        """See :meth:`RequestLog.verbs`."""
        return self.log.verbs(since)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds, re-checked on every request and change (in a
        thread of its own: :func:`~hetero_dp.testing.waiting.wait_on`)."""
        if not await wait_on(self._cond, predicate, timeout):
            raise TimeoutError(f"condition not met within {timeout}s")

    # request handling (runs in the HTTP server's threads)

    def record(self, request: Request) -> None:
        """Note a request answered (``requests``), waking whoever waits on the server."""
        self.log.record(request)

    def is_watch(self, method: str, raw_path: str) -> bool:
        """Whether a request opens a ResourceSlice watch stream (``watch=true``)."""
        found = route(raw_path, self.serving.versions)
        return (
            method == "GET"
            and found is not None
            and found[1] == ["resourceslices"]
            and found[2].get("watch") in ("true", "1")
        )

    def serve_watch(self, handler: BaseHTTPRequestHandler) -> None:
        """A watch stream (see :mod:`.watch`) on ``handler``'s connection."""
        found = route(handler.path, self.serving.versions)
        assert found is not None
        version, _, query = found
        self.streams.serve(handler, version, query)

    def handle(self, method: str, raw_path: str, body: Any) -> tuple[int, dict[str, Any]]:
        """Answer one request as the API server would: (HTTP status, JSON body)."""
        return answer(self.store, self.serving.versions, method, raw_path, body)
