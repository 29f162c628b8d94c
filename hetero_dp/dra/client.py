"""A small Kubernetes API client: plain HTTP(S) on the standard library.

DRA mode needs a handful of JSON calls (list, watch, create, replace, delete,
get) on two resources. The official ``kubernetes`` package costs about 2.4 s of
import and 24 MiB of memory per process for them (measured, docs/benchmarks.md)
and stacks urllib3's retries under our own; this module is ``http.client`` and
``ssl``, with:

- **One connection attempt per call.** A call that cannot connect raises
  :class:`APIError` (status 0, ``Unreachable``) at once; retrying is the
  caller's, through the one policy :class:`Backoff`. The only second try is on
  a *kept-alive* connection that failed before a byte of the answer came back
  (the server closed it while it sat idle): that one is sent again at once on a
  fresh connection, which is the call's first connection attempt, and the other
  idle connections, as old, are dropped. kube-apiserver closes connections idle
  for 90 s (its ``IdleTimeout``) without a TLS ``close_notify``, so the next
  request on one fails with ``ssl.SSLEOFError`` ("EOF occurred in violation of
  protocol"), a reset or a broken pipe rather than an empty answer (issue #36,
  measured against kube-apiserver 1.36).
- **Deadlines, not only timeouts.** A socket timeout bounds one read, and a
  server sending a byte every few seconds would hold a call for ever: each call
  has a whole deadline (:data:`REQUEST_TIMEOUT`, connecting included), after
  which its socket is cut (:mod:`.deadlines`) and the call fails with
  ``Timeout``, logged. An answer is read up to :data:`MAX_RESPONSE_BYTES` and
  refused beyond (``TooLarge``), before it is decoded. A watch stream has no
  whole deadline but an idle one (no complete event within the stream's time)
  and a cap per event (:data:`MAX_EVENT_BYTES`). :meth:`KubeClient.close` cuts
  every call in flight, so a stopping driver never waits on the server.
- **Configuration** as client-go loads it: in a pod the service account
  (``KUBERNETES_SERVICE_HOST``/``_PORT``, the token and ``ca.crt`` under
  ``/var/run/secrets/kubernetes.io/serviceaccount``, ``rest.InClusterConfig``),
  elsewhere a kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``; the current
  context's cluster ``server``, ``certificate-authority(-data)``,
  ``insecure-skip-tls-verify`` and user ``token``, ``tokenFile``,
  ``client-certificate(-data)``/``client-key(-data)``). Exec and auth-provider
  plugins are refused with a message saying so.
- **Token rotation.** A projected service-account token is rewritten by the
  kubelet before it expires ("Service account token volume projection",
  Kubernetes docs); client-go re-reads the file at most a minute apart
  (``transport/token_source.go``, ``NewCachedFileTokenSource``), and so does this.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from hetero_dp.dra.deadlines import Deadline, Watchdog, cut
from hetero_dp.dra.kubeconfig import ClusterConfig, load_config, ssl_context

__all__ = ["APIError", "Backoff", "ClusterConfig", "KubeClient", "Stream", "load_config"]

log = logging.getLogger(__name__)

#: Seconds one call may take, all of it (connect, send, the whole answer).
REQUEST_TIMEOUT = 10.0
#: The largest answer read. etcd refuses a request over 1.5 MiB (its default
#: ``--max-request-bytes``; "etcd: System limits"), so one object is below it,
#: and DRA's largest answer, one node's pool of one driver, is a few slices.
MAX_RESPONSE_BYTES = 16 << 20
#: The largest watch event (one line of a watch stream: one object).
MAX_EVENT_BYTES = 4 << 20
TOKEN_REREAD = 60.0  # seconds, as client-go's cached file token source


class APIError(Exception):
    """An API server answer other than success, with its own reason and message.

    Status 0: no answer at all (``Unreachable``: the connection failed or broke).
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"HTTP {status} {reason}: {message}")

    @classmethod
    def from_status(cls, status: int, body: bytes, default_reason: str = "") -> APIError:
        """From an error answer whose body is (usually) a ``Status`` object."""
        reason, message = default_reason, ""
        try:
            obj = json.loads(body or b"")
            reason = str(obj.get("reason") or reason)
            message = str(obj.get("message") or "")
        except (ValueError, TypeError, AttributeError):
            message = body[:500].decode(errors="replace")
        return cls(status, reason, message)

    @property
    def expired(self) -> bool:
        """410 Gone / ``Expired``: a resourceVersion too old to watch or list from."""
        return self.status == 410 or self.reason in ("Expired", "Gone")

    @property
    def retriable(self) -> bool:
        """Worth another try after a back-off: no answer, throttled or a server error."""
        return self.status == 0 or self.status == 429 or self.status >= 500


#: The back-off's cap, in seconds. A driver whose server went away looks again at
#: most this long after the last try, so a pool lost while the server was down is
#: back within about this long after it answers again (the goal is 2 s; relisting and
#: writing take tens of ms more). The price, at N nodes: a dead server gets N/1.2
#: connection attempts a second (one per try; refused by the kernel where nothing
#: listens), and a returning one the fleet's relists within 1.6 s (about N/1.6 LISTs
#: a second, each of one node's slices). For comparison, client-go's reflector caps
#: at 30 s with jitter 1 (tries every 30-60 s once capped).
RETRY_CAP = 1.6


class Backoff:
    """The one retry policy of DRA mode: exponential back-off with jitter and a cap.

    Delay ``n`` (from 0) is ``min(cap, base * 2**n)`` scaled by a random factor in
    ``[1 - jitter, 1]``, so a fleet that lost the server at the same moment does
    not come back in step. :meth:`reset` after a success.
    """

    def __init__(
        self,
        base: float = 0.5,
        cap: float = RETRY_CAP,
        jitter: float = 0.5,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.rand = rand
        self.failures = 0

    def next(self) -> float:
        delay = min(self.cap, self.base * 2 ** min(self.failures, 30))
        self.failures += 1
        return delay * (1.0 - self.jitter * self.rand())

    def reset(self) -> None:
        self.failures = 0


class _Connection(http.client.HTTPConnection):
    """An HTTP connection that notes whether a byte of the answer came back."""

    answered = False  # a byte of the current answer arrived

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response_class = self._response  # type: ignore[assignment]

    def _response(self, sock: Any, *args: Any, **kwargs: Any) -> http.client.HTTPResponse:
        return _Response(self, sock, *args, **kwargs)


class _TLSConnection(http.client.HTTPSConnection, _Connection):
    pass


class _Response(http.client.HTTPResponse):
    def __init__(self, conn: _Connection, sock: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self._conn = conn

    def begin(self) -> None:
        if self.fp is not None and self.fp.peek(1):  # raises or is b"" when nothing came
            self._conn.answered = True
        super().begin()


class TooLarge(Exception):
    pass


class Stream:
    """An open streaming answer (a watch): :meth:`lines` yields its JSON lines.

    ``idle``: seconds a complete line may take; the socket is cut when one does
    not come in time (``timed_out`` then says so)."""

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        watchdog: Watchdog | None = None,
        idle: float | None = None,
        max_line: int = MAX_EVENT_BYTES,
    ):
        self._conn = conn
        self._response = response
        self._watchdog = watchdog
        self._idle = idle
        self.max_line = max_line
        self._deadline: Deadline | None = None
        if watchdog is not None and idle is not None:
            self._deadline = watchdog.arm(conn, time.monotonic() + idle)

    @property
    def timed_out(self) -> bool:
        return self._deadline is not None and self._deadline.fired

    def lines(self) -> Iterator[bytes]:
        """The stream's non-empty lines; raises :class:`APIError` (``TooLarge``) on a
        line over ``max_line``, and ``Timeout`` when the idle deadline cut it."""
        try:
            while True:
                line = self._response.readline(self.max_line + 1)
                if len(line) > self.max_line:
                    raise APIError(
                        0, "TooLarge", f"a watch event over {self.max_line} bytes; stream dropped"
                    )
                if not line:
                    break
                if self._deadline is not None and self._watchdog is not None and self._idle:
                    self._watchdog.move(self._deadline, time.monotonic() + self._idle)
                if line.strip():
                    yield line
        except (OSError, http.client.HTTPException, ValueError):
            if not self.timed_out:
                raise
        if self._deadline is not None and self._deadline.stopped:
            raise APIError(0, "Closed", "the watch was cut: the API client was closed")
        if self.timed_out:
            log.warning(
                "API server: no watch event within %.0fs; the stream was cut", self._idle or 0
            )
            raise APIError(0, "Timeout", f"no watch event within {self._idle:.0f}s")

    def shutdown(self) -> None:
        """From another thread: cut the connection, so a blocked read returns."""
        cut(self._conn.sock)

    def close(self) -> None:
        if self._deadline is not None and self._watchdog is not None:
            self._watchdog.disarm(self._deadline)
        with contextlib.suppress(Exception):
            self._conn.close()


class KubeClient:
    """JSON calls to one API server; thread-safe (a small pool of kept-alive connections).

    ``connects`` counts connection attempts and ``calls`` the calls made, for
    benchmarks and tests.
    """

    def __init__(self, config: ClusterConfig, timeout: float = REQUEST_TIMEOUT) -> None:
        self.config = config
        self.timeout = timeout
        url = urlsplit(config.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"API server URL {config.server!r} must be http(s)://host[:port]")
        self.scheme = url.scheme
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self._ssl = ssl_context(config) if url.scheme == "https" else None
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._token = config.token
        self._token_read = -TOKEN_REREAD
        self.connects = 0
        self.calls = 0
        self.most_connects = 0  # the most connection attempts one call made
        self.max_response = MAX_RESPONSE_BYTES
        self._watchdog = Watchdog(f"API deadlines {self.host}")
        self._closed = False

    @property
    def server(self) -> str:
        return self.config.server

    # --- plumbing -----------------------------------------------------------

    def _headers(self, body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "hetero-dp"}
        if body:
            headers["Content-Type"] = "application/json"
        token = self._current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _current_token(self) -> str:
        if not self.config.token_file:
            return self._token
        now = time.monotonic()
        if now - self._token_read >= TOKEN_REREAD:
            with contextlib.suppress(OSError):
                self._token = Path(self.config.token_file).read_text().strip()
                self._token_read = now
        return self._token

    def _connection(self, timeout: float) -> _Connection:
        with self._lock:
            self.connects += 1
        if self._ssl is not None:
            return _TLSConnection(self.host, self.port, timeout=timeout, context=self._ssl)
        return _Connection(self.host, self.port, timeout=timeout)

    def _take(self) -> tuple[_Connection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connection(self.timeout), False

    def _give_back(self, conn: _Connection) -> None:
        with self._lock:
            if len(self._idle) < 4 and not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    def _drop_idle(self) -> None:
        """A kept-alive connection went stale: the others, as old, go too."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        return self.prefix + quote(path) + (f"?{urlencode(q)}" if q else "")

    # --- calls ----------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        """One call, within :data:`REQUEST_TIMEOUT` (``timeout``) all of it; the decoded
        JSON answer, or :class:`APIError`."""
        data = None if body is None else json.dumps(body).encode()
        target = self.url(path, query)
        with self._lock:
            self.calls += 1
        if self._closed:
            raise APIError(0, "Closed", "the API client is closed (the driver stops)")
        when = time.monotonic() + self.timeout
        conn, reused = self._take()
        made = 0 if reused else 1
        while True:
            conn.answered = False
            guard = self._watchdog.arm(conn, when)
            try:
                conn.timeout = max(0.001, guard.left())  # bounds connecting (no socket yet)
                conn.request(method, target, body=data, headers=self._headers(data is not None))
                response = conn.getresponse()
                payload = self._read_body(response)
            except (OSError, http.client.HTTPException, TooLarge) as e:
                fired = self._watchdog.disarm(guard)
                conn.close()
                if fired or isinstance(e, TimeoutError):
                    self._note(made)
                    raise self._timed_out(method, path, guard) from None
                if isinstance(e, TooLarge):
                    self._note(made)
                    raise APIError(0, "TooLarge", f"{method} {path}: {e}") from None
                if reused and not conn.answered and not self._closed:
                    # a kept-alive connection the server had closed: once more, fresh
                    self._drop_idle()
                    conn, reused = self._connection(self.timeout), False
                    made += 1
                    continue
                self._note(made)
                raise APIError(0, "Unreachable", f"cannot reach the API server: {e!r}") from None
            fired = self._watchdog.disarm(guard)
            break
        self._note(made)
        if response.will_close or fired:
            conn.close()
        else:
            self._give_back(conn)
        if not 200 <= response.status < 300:
            raise APIError.from_status(response.status, payload, response.reason)
        try:
            answer: dict[str, Any] = json.loads(payload or b"{}")
        except ValueError as e:
            raise APIError(response.status, "BadResponse", f"not JSON: {e}") from None
        return answer

    def _read_body(self, response: http.client.HTTPResponse) -> bytes:
        """The whole answer, refused (:class:`TooLarge`) beyond ``max_response``."""
        cap = self.max_response
        if response.length is not None and response.length > cap:
            raise TooLarge(f"an answer of {response.length} bytes (the most read is {cap})")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = response.read(min(1 << 16, cap + 1 - total))
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > cap:
                raise TooLarge(f"an answer of more than {cap} bytes, not read further")
            chunks.append(chunk)

    def _timed_out(self, method: str, path: str, guard: Deadline) -> APIError:
        if guard.stopped:
            return APIError(0, "Closed", f"{method} {path}: cut, the API client was closed")
        log.warning(
            "API server: %s %s got no whole answer within %.0fs; connection cut",
            method,
            path,
            self.timeout,
        )
        return APIError(0, "Timeout", f"no whole answer within {self.timeout:.0f}s")

    def stream(
        self, path: str, *, query: Mapping[str, Any] | None = None, timeout: float
    ) -> Stream:
        """A streaming GET (a watch) on a connection of its own. Its answer's head
        comes within the request deadline; then ``timeout`` is how long a complete
        line (an event) may take, each one starting the wait over."""
        with self._lock:
            self.calls += 1
        if self._closed:
            raise APIError(0, "Closed", "the API client is closed (the driver stops)")
        conn = self._connection(self.timeout)
        guard = self._watchdog.arm(conn, time.monotonic() + self.timeout)
        try:
            conn.request("GET", self.url(path, query), headers=self._headers(False))
            response = conn.getresponse()
            if response.status != 200:
                payload = self._read_body(response)
        except (OSError, http.client.HTTPException, TooLarge) as e:
            fired = self._watchdog.disarm(guard)
            conn.close()
            if fired or isinstance(e, TimeoutError):
                raise self._timed_out("WATCH", path, guard) from None
            raise APIError(0, "Unreachable", f"cannot reach the API server: {e!r}") from None
        self._watchdog.disarm(guard)
        if response.status != 200:
            conn.close()
            raise APIError.from_status(response.status, payload, response.reason)
        if conn.sock is not None:  # the idle deadline below bounds the reads now
            conn.sock.settimeout(None)
        return Stream(conn, response, self._watchdog, idle=timeout)

    def _note(self, made: int) -> None:
        with self._lock:
            self.most_connects = max(self.most_connects, made)

    def close(self) -> None:
        """No more calls: the idle connections close and every call in flight (a
        watch too) is cut, so no thread waits on the server past this."""
        with self._lock:
            self._closed = True
        self._drop_idle()
        self._watchdog.cut_all()
