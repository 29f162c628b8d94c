"""The unix sockets a front end serves on, shared by both front ends (device plugin and
DRA): binding one with owner-only mode, removing only the socket we bound (same inode),
clearing the sockets of dead instances, and the probe "is anyone listening?" (for the
plugin's own sockets: a live instance's or a dead one's? and for doctor's look at the
kubelet's)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from hetero_dp.model.errors import ConfigError
from hetero_dp.model.names import MAX_UNIX_PATH

if TYPE_CHECKING:
    import grpc


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


# The mode of every socket we bind, whatever the umask: only the owner (the kubelet
# runs as root, which needs no permission bit) may connect.
SOCKET_MODE = 0o600


def socket_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, or None if there is none."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def remove_own_socket(path: Path, identity: tuple[int, int] | None) -> bool:
    """Remove ``path`` only if it is still the socket we bound (same device and inode):
    a file another instance (or a restarted kubelet) put there since is left alone."""
    if identity is None or socket_identity(path) != identity:
        return False
    return remove_socket(path)


def remove_stale_sockets(directory: Path, prefix: str, suffix: str = ".sock") -> list[Path]:
    """Remove the sockets ``<prefix>-*<suffix>`` in ``directory`` that nobody answers on:
    left by instances that died without cleaning up (a SIGKILL, a node crash). A live
    instance's socket accepts connections (it listens from the moment it is bound),
    so it is never taken for stale."""
    removed: list[Path] = []
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return removed
    for path in entries:
        if not (path.name.startswith(f"{prefix}-") and path.name.endswith(suffix)):
            continue
        try:
            if not stat.S_ISSOCK(path.lstat().st_mode) or socket_in_use(path):
                continue
        except FileNotFoundError:
            continue
        identity = socket_identity(path)
        if not socket_in_use(path) and remove_own_socket(path, identity):
            removed.append(path)
    return removed


def remove_socket(path: Path) -> bool:
    """Remove ``path`` if it is a unix socket (never a regular file); True if removed."""
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
            return True
    except FileNotFoundError:
        pass
    return False


def socket_in_use(path: Path) -> bool:
    """True if a process holds the unix socket ``path`` now (it accepts connections, or
    answers anything but a refusal): :func:`hetero_dp.kits.sockets.socket_listens`."""
    return socket_listens(path, timeout=1.0) is True


def claim_socket_path(path: Path, what: str) -> bool:
    """Make ``path`` free to bind: remove a stale socket (True if one was removed);
    ConfigError when a regular file or a live socket of another process sits there:
    a second instance for the same resource must not take the first one's socket."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise ConfigError(
            f"{path} exists and is not a socket; remove it or use another socketPrefix",
            field=what,
        )
    if socket_in_use(path):
        raise ConfigError(
            f"{path} is the socket of another running instance (it accepts connections); "
            "stop that one first, or give this one another socketPrefix",
            field=what,
        )
    return remove_socket(path)


def bind_unix(server: grpc.aio.Server, path: Path) -> tuple[int, int] | None:
    """Add a unix socket port to ``server`` with mode :data:`SOCKET_MODE`; returns the
    (device, inode) of the file, which only :func:`remove_own_socket` removes.

    The socket is bound under a hidden temporary name beside ``path`` and renamed to
    ``path`` (a bound socket keeps working under its new name): gRPC unlinks the path
    it bound when its server stops, whatever file is there by then, and that must
    never be another instance's socket. The kubelet's plugin watcher skips hidden
    files, and connecting clients see the socket appear whole. Where the temporary
    name would not fit a unix socket path, ``path`` is bound directly."""
    tmp = path.with_name(f".{path.name}.{os.urandom(3).hex()}")
    target = tmp if len(os.fsencode(tmp)) <= MAX_UNIX_PATH else path
    server.add_insecure_port(f"unix://{target}")
    with contextlib.suppress(FileNotFoundError):
        os.chmod(target, SOCKET_MODE)
    if target != path:
        os.rename(target, path)
    return socket_identity(path)


def check_socket_path(
    path: Path, advice: str = "use a shorter --kubelet-dir or socket prefix"
) -> None:
    """ValueError when ``path`` is too long for a unix socket; ``advice``: what to
    shorten (the setting the path comes from)."""
    if len(os.fsencode(path)) > MAX_UNIX_PATH:
        raise ValueError(
            f"socket path {path} is {len(os.fsencode(path))} bytes; unix sockets allow "
            f"{MAX_UNIX_PATH}: {advice}"
        )
