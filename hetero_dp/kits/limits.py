"""The process limits the daemon needs, checked before it serves; descriptors running
out at run time reported once.

Under a low ``ulimit -n`` the daemon used to fail half-way (issue #36: with 30
descriptors six of ten resources never registered and gRPC wrote NUL bytes into
log lines; with 24 a traceback), and under a low ``ulimit -v`` gRPC could not start
its threads and SIGTERM aborted the process. :func:`check_limits` computes what
the daemon will hold and, when a soft limit is lower, raises it up to the hard
limit (as Go programs do at start since Go 1.19, "os: raise open file limit"), or
stops start-up with :class:`~hetero_dp.model.errors.StartError` naming the limit
and the value needed (``hetero-dp run`` exits 2).

:func:`report_exhaustion` makes the loop's handler of errors it cannot give to
anyone (asyncio's accept loop on ``EMFILE``: "socket.accept() out of system
resource", with a traceback each time it tries) one line per cause, at most one
a minute.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
from pathlib import Path
from typing import Any

from hetero_dp.kits.logs import Repeats
from hetero_dp.model.errors import StartError

log = logging.getLogger(__name__)

MiB = 1 << 20

# Descriptors: measured with the simulated backend (ls /proc/PID/fd): 48 for 10
# resources in device-plugin mode with an in-process fake kubelet (both ends of its
# connections counted), 14 with none. The base covers the interpreter, asyncio's
# and gRPC's epoll and event fds, inotify, logs and the probe listener, plus the
# probe server's connections (ops/probes.py: 32 open and 32 being accepted); per resource
# its listening socket, the kubelet's connection, the registration channel and a
# DRA driver's API connections; per device what a backend may keep open (NVML opens
# each GPU's /dev/nvidiaN).
BASE_FDS = 128
FDS_PER_RESOURCE = 8
FDS_PER_DEVICE = 2
# Address space: what is mapped when the check runs, and what the daemon maps after
# it. gRPC starts its threads when the first server or channel starts, after this
# check; each thread reserves its stack (RLIMIT_STACK, 8 MiB by default) and, with
# glibc, may get a malloc arena that reserves 64 MiB (mallopt(3), M_ARENA_MAX).
# Measured with the simulated backend, 10 resources, 2 cores: 560 MiB mapped at the
# check, VmPeak 713 MiB (9 threads); the reserve is 2.5 times that growth, for
# machines with more cores (more gRPC threads and arenas).
RESERVE = 384 * MiB
STARTED = 640 * MiB  # mapped at the check before serving: 560-631 MiB measured


def descriptor_need(resources: int, devices: int) -> int:
    return BASE_FDS + FDS_PER_RESOURCE * resources + FDS_PER_DEVICE * devices


def address_space_need() -> int:
    """Bytes: the address space mapped by a started daemon (or now, when more) and the
    reserve for what comes after."""
    return max(_mapped(), STARTED) + RESERVE


def _mapped() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 256 * MiB  # no /proc: about what a started daemon maps (measured ~250 MiB)


def _ensure(which: int, need: int, name: str, advice: str, unit: int = 1) -> None:
    """``unit``: what the values are shown in (1024: KiB, as ``ulimit -v`` takes them)."""
    soft, hard = resource.getrlimit(which)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        try:
            resource.setrlimit(which, (need, hard))
            log.info("raised the soft limit %s from %d to %d", name, soft // unit, need // unit)
            return
        except (ValueError, OSError):
            pass
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard // unit)
    raise StartError(
        f"the process limit {name} is {soft // unit} (hard {shown}); hetero-dp needs at "
        f"least {-(-need // unit)} {advice}",
        source="process limits",
    )


def check_limits(resources: int = 0, devices: int = 0) -> None:
    """Raise the soft limits to what ``resources`` and ``devices`` need, or stop
    start-up naming the limit (:class:`StartError`)."""
    fds = descriptor_need(resources, devices)
    serving = f"for {resources} resources with {devices} devices" if resources else "to start"
    _ensure(
        resource.RLIMIT_NOFILE,
        fds,
        "RLIMIT_NOFILE (open files, ulimit -n)",
        f"{serving}: raise it (ulimit -n {fds}, LimitNOFILE= of a systemd unit, or the "
        "container runtime's nofile ulimit)",
    )
    space = address_space_need()
    log.debug("limits: %d descriptors and %d MiB of address space needed", fds, space // MiB)
    _ensure(
        resource.RLIMIT_AS,
        space,
        "RLIMIT_AS (address space in KiB, ulimit -v)",
        f"for gRPC's threads, which reserve stacks and malloc arenas: raise it (ulimit -v "
        f"{-(-space // 1024)}; unlimited is the default)",
        unit=1024,
    )


_EXHAUSTED = (errno.EMFILE, errno.ENFILE)


def report_exhaustion(loop: asyncio.AbstractEventLoop) -> None:
    """Errors of descriptors running out, which the loop would log with a traceback
    at every try, become one line per cause at most once a minute (with the count
    left out); anything else goes to the handler as before."""
    previous = loop.get_exception_handler()
    repeats = Repeats(first=60.0, longest=600.0)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _EXHAUSTED:
            cause = str(context.get("message") or "")
            show, left_out = repeats.check(("exhausted", cause, exc.errno))
            if show:
                soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                more = f" ({left_out} more since the last line)" if left_out else ""
                log.error(
                    "out of file descriptors (%s; RLIMIT_NOFILE %s): %s; connections are "
                    "refused until some close%s",
                    os.strerror(exc.errno),
                    soft,
                    cause,
                    more,
                )
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
