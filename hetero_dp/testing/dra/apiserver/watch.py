"""The stand-in API server's watch streams (``watch=true`` on ResourceSlices).

As the real server streams them (Kubernetes docs, "API Concepts": *Efficient
detection of changes*, *Watch bookmarks*; the cacher,
``staging/src/k8s.io/apiserver/pkg/storage/cacher/``): ADDED/MODIFIED/DELETED
events, one JSON object per chunk, from ``resourceVersion``, ending after
``timeoutSeconds``. A watch from a ``resourceVersion`` older than the watch cache
holds gets ``410 Gone`` (reason ``Expired``, "too old resource version"), as an
``ERROR`` event in a 200 stream (what the watch cache sends) or, with
``expired_as="status"``, as the answer's status. Bookmarks (only for a watch that
asks, ``allowWatchBookmarks=true``) carry the current ``resourceVersion`` every
``bookmark_interval`` seconds (the cacher's ``bookmarkFrequency``, a minute) and
once shortly before the watch's ``timeoutSeconds`` end, so the client resumes
from there.
"""

from __future__ import annotations

import contextlib
import functools
import json
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from hetero_dp.testing.dra.apiserver.objects import Request, status
from hetero_dp.testing.dra.apiserver.schema import GROUP, from_v1
from hetero_dp.testing.dra.apiserver.store import ObjectStore, selected

WATCH_POLL = 0.2  # how often a watch stream checks that its client is still there


def _delivering() -> threading.Event:
    ev = threading.Event()
    ev.set()
    return ev


@dataclass
class Serving:
    """The API server process serving now, and what it serves (read by every watch)."""

    versions: tuple[str, ...]
    epoch: int = 0  # the API server process serving now (serve(..., drain=...))
    cut_at: float = 0.0  # when the draining process cuts its watches
    stopping: bool = False
    # cleared: watch events are held back
    delivering: threading.Event = field(default_factory=_delivering)


def peer_closed(sock: Any) -> bool:
    """True when the client closed its end (readable with nothing to read)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class WatchStreams:
    """Serves each watch request on its HTTP handler's thread; counts those open."""

    def __init__(
        self,
        store: ObjectStore,
        serving: Serving,
        record: Callable[[Request], None],
        *,
        bookmark_interval: float = 60.0,
        expired_as: str = "event",
    ) -> None:
        self.store = store
        self.serving = serving
        self.record = record
        self.bookmark_interval = bookmark_interval
        self.expired_as = expired_as  # "event" (an ERROR event) or "status" (HTTP 410)
        self.watches = 0  # watch streams open now

    def serve(self, handler: BaseHTTPRequestHandler, version: str, query: dict[str, str]) -> None:
        """A watch stream: one JSON event per chunk (``{"type", "object"}``), as the
        real server sends with ``watch=true``; from ``resourceVersion`` on, or an
        ADDED event per object first when none is given; ends after ``timeoutSeconds``.
        From a ``resourceVersion`` older than the history held: ``410 Expired``."""
        store, serving, cond = self.store, self.serving, self.store.cond
        timeout = float(query.get("timeoutSeconds") or 1800)
        start = time.monotonic()
        deadline = start + timeout
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        # the cacher sends one shortly before the deadline, so the client resumes from it
        final_bookmark = deadline - min(1.0, timeout / 4)
        next_bookmark = min(start + self.bookmark_interval, final_bookmark)
        since = query.get("resourceVersion")
        with cond:
            expired = since not in (None, "", "0") and int(since) < store.compacted
            oldest = store.compacted
        code = 410 if expired and self.expired_as == "status" else 200
        gone = status(
            410, "Expired", f"too old resource version: {since} ({oldest})"
        )  # the watch cache's wording (watch_cache.go)
        if code == 410:
            data = json.dumps(gone).encode()
            self.record(Request("WATCH", handler.path, 410))
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
            write({"type": kind, "object": from_v1(obj, version)})

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

        with cond:
            epoch = serving.epoch
            self.watches += 1
            self.record(Request("WATCH", handler.path, 200))
            pending: list[tuple[str, dict[str, Any]]] = []
            if since in (None, "", "0"):
                pending = [("ADDED", o) for o in store.slices.values() if selected(o, query)]
                last = store.rv
            else:
                last = int(since)
        try:
            if expired:  # one ERROR event, then the end of the stream
                write({"type": "ERROR", "object": gone})
                pending = []
            while not expired:
                if serving.epoch != epoch:  # on a draining process: silent, then cut
                    if peer_closed(handler.connection) or self._drained(handler, deadline):
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
                if peer_closed(handler.connection):  # the client went away
                    break
                wake = deadline if not bookmarks else min(deadline, next_bookmark)
                with cond:
                    cond.wait_for(
                        functools.partial(self._wakes, last, version, wake),
                        timeout=min(WATCH_POLL, max(0.0, wake - time.monotonic())),
                    )
                    if serving.epoch != epoch:
                        continue
                    if serving.stopping or version not in serving.versions:
                        break
                    if not serving.delivering.is_set():
                        pending = []
                        continue
                    fresh = store.changes_after(last)
                    if fresh:
                        last = fresh[-1][0]
                    pending = [(k, o) for _, k, o in fresh if selected(o, query)]
                    if not fresh and time.monotonic() >= deadline:
                        break
            handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with cond:
                self.watches -= 1
                cond.notify_all()
        handler.close_connection = True

    def _drained(self, handler: BaseHTTPRequestHandler, deadline: float) -> bool:
        """One wait of a watch on a draining process; True when it was cut (no last
        chunk). At its own deadline it ends as usual (False, and the caller's next
        check ends it)."""
        serving, cond = self.serving, self.store.cond
        with cond:
            cond.wait_for(
                lambda: serving.stopping or time.monotonic() >= min(serving.cut_at, deadline),
                timeout=WATCH_POLL,
            )
            cut = serving.stopping or time.monotonic() >= serving.cut_at
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

    def _wakes(self, last: int, version: str, deadline: float) -> bool:
        store, serving = self.store, self.serving
        return bool(
            serving.stopping
            or (store.events and store.events[-1][0] > last and serving.delivering.is_set())
            or version not in serving.versions
            or time.monotonic() >= deadline
        )
