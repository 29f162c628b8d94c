"""Directory watching with Linux inotify on the asyncio loop: no polling, no threads.

A small ctypes binding (libc's inotify_init1/inotify_add_watch) read through
``loop.add_reader``; callbacks get ``(name, event)`` with ``event`` one of
``"created"`` or ``"deleted"``.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_IGNORED = 0x00008000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

_EVENT = struct.Struct("iIII")
_libc: ctypes.CDLL | None = None

Callback = Callable[[str, str], None]


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        # The process's own symbols (dlopen(NULL)) include libc's on glibc and musl
        # alike; ctypes.util.find_library would import shutil, tempfile and subprocess
        # and run `ldconfig -p` at every start (6 ms) to find the same library.
        lib = ctypes.CDLL(None, use_errno=True)
        if not hasattr(lib, "inotify_init1"):  # a statically odd build: ask the linker
            from ctypes.util import find_library

            lib = ctypes.CDLL(find_library("c") or "libc.so.6", use_errno=True)
        _libc = lib
        _libc.inotify_init1.argtypes = [ctypes.c_int]
        _libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return _libc


class DirectoryWatcher:
    """Watch one directory for entries created (or moved in) and deleted (or moved out)."""

    def __init__(self, path: str | os.PathLike[str], callback: Callback, *, modified: bool = False):
        self.path = Path(path)
        self._callback = callback
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mask = IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF
        if modified:
            self._mask |= IN_CLOSE_WRITE | IN_MODIFY

    def start(self) -> None:
        libc = _lib()
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        wd = libc.inotify_add_watch(fd, os.fsencode(self.path), self._mask)
        if wd < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch {self.path}: {os.strerror(err)}")
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._read)

    def close(self) -> None:
        if self._fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EINTR):
                return
            raise
        offset = 0
        while offset + _EVENT.size <= len(data):
            _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
            offset += _EVENT.size + length
            name = raw.rstrip(b"\0").decode(errors="replace")
            if mask & (IN_CREATE | IN_MOVED_TO):
                kind = "created"
            elif mask & (IN_DELETE | IN_MOVED_FROM):
                kind = "deleted"
            elif mask & (IN_CLOSE_WRITE | IN_MODIFY):
                kind = "modified"
            elif mask & (IN_DELETE_SELF | IN_IGNORED):
                kind, name = "gone", ""
            else:
                continue
            try:
                self._callback(name, kind)
            except Exception:  # a bad subscriber must not kill the reader
                log.exception("inotify callback failed for %s %s", kind, name)
