"""Signals that arrive before the event loop handles them.

Python's defaults end the process on SIGTERM and SIGHUP and raise
KeyboardInterrupt on SIGINT, wherever it is: a SIGHUP (a config reload) sent in
the first moments of start-up killed the daemon. :func:`hold_signals` records
them instead, from the first line of a command on; the daemon installs its own
handlers when its loop runs and then acts on what was held (:func:`held`).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

HELD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_held: list[int] = []


def _record(signum: int, frame: FrameType | None) -> None:
    if signum not in _held:  # once is enough; a SIGHUP never taken cannot pile up
        _held.append(signum)


def hold_signals() -> None:
    """Record SIGTERM, SIGINT and SIGHUP from now on instead of dying of them
    (main thread only; elsewhere Python refuses signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in HELD:
        signal.signal(sig, _record)


def held() -> list[int]:
    """The signals recorded so far, oldest first; taking them clears the record."""
    out = list(_held)
    _held.clear()
    return out
