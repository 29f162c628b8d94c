"""Is anyone listening on a unix socket? One probe for the plugin's own sockets (is a
socket at our path a live instance's or a dead one's?) and for doctor's look at the
kubelet's."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path


def socket_listens(path: Path, timeout: float = 1.0) -> bool | None:
    """True if something accepts connections on the unix socket ``path``, False if it
    is stale (connecting is refused), None if ``path`` is not a socket (or is gone).

    Only a refusal means stale: anything else (a full backlog, a timeout) means some
    process holds it, so it is never taken for a dead one's and removed."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return None
    except FileNotFoundError:
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(os.fspath(path))
        return True
    except OSError as e:
        return e.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        s.close()
