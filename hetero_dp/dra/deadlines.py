"""Deadlines for blocking socket work: a call's socket is cut when its time is up.

A socket timeout bounds one read, not a call: a server that sends one byte
every few seconds keeps every read short and the call open for ever. A
:class:`Watchdog` holds a deadline per call in flight and, when one passes,
shuts the call's socket down (``shutdown(SHUT_RDWR)`` on the descriptor, TLS or
not), so the read blocked in the calling thread returns at once and the caller
sees :attr:`Deadline.fired`. The same cut, for every call at once, is
:meth:`Watchdog.cut_all`: a stopping process does not wait for a slow server.

One daemon thread per watchdog, started with the first deadline; it sleeps
until the nearest one.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from typing import Any, Protocol


class HasSocket(Protocol):
    """What a deadline guards: anything with a ``sock`` (an ``http.client`` connection)."""

    sock: Any


def cut(sock: Any) -> None:
    """Shut ``sock`` down in both directions, from any thread, without a TLS goodbye:
    a read blocked on it returns (EOF or an error)."""
    if sock is None:
        return
    with contextlib.suppress(OSError, TypeError, ValueError):
        # the base method: SSLSocket.shutdown would drop its TLS state under a
        # reader in another thread; the descriptor's shutdown wakes that reader
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Deadline:
    """One call's deadline; ``fired`` once the watchdog cut its socket, ``stopped``
    when that was :meth:`Watchdog.cut_all` rather than the time passing."""

    __slots__ = ("done", "fired", "owner", "stopped", "when")

    def __init__(self, owner: HasSocket, when: float) -> None:
        self.owner = owner
        self.when = when
        self.fired = False
        self.stopped = False
        self.done = False

    def left(self) -> float:
        return max(0.0, self.when - time.monotonic())


class Watchdog:
    def __init__(self, name: str = "deadlines") -> None:
        self.name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._live: set[Deadline] = set()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, owner: HasSocket, when: float) -> Deadline:
        """Cut ``owner.sock`` at ``when`` (a ``time.monotonic()`` value) unless
        :meth:`disarm` comes first."""
        d = Deadline(owner, when)
        with self._cond:
            self._live.add(d)
            heapq.heappush(self._heap, (when, next(self._seq), d))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return d

    def move(self, d: Deadline, when: float) -> None:
        """A new time for ``d`` (an idle deadline that starts over)."""
        with self._cond:
            if d.done or d.fired:
                return
            d.when = when
            heapq.heappush(self._heap, (when, next(self._seq), d))
            self._cond.notify()

    def disarm(self, d: Deadline) -> bool:
        """The call ended; True when its deadline had fired (its socket was cut)."""
        with self._cond:
            d.done = True
            self._live.discard(d)
            return d.fired

    def cut_all(self) -> int:
        """Cut every call in flight now (a stop); the number cut."""
        with self._cond:
            live, self._live = list(self._live), set()
            for d in live:
                d.fired = d.stopped = True
                cut(d.owner.sock)
        return len(live)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
                    when, _, d = heapq.heappop(self._heap)
                    if d.done or d.fired or when != d.when:
                        continue  # ended, or moved (a newer entry stands for it)
                    d.fired = True
                    self._live.discard(d)
                    cut(d.owner.sock)
                wait = self._heap[0][0] - now if self._heap else None
                self._cond.wait(wait)
