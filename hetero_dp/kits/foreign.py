"""Reading a file someone else may have put here: a spec in the CDI dir, a label file,
an entry of the kubelet's dirs, a config file. Such a dir may hold anything (a FIFO
named ``x.json``, a socket, a device node, a symlink loop, a file of gigabytes, JSON
nested 50,000 deep), and reading it must never block, never take unbounded memory or
stack, and say what is wrong in one line.

:func:`read_foreign` opens without blocking (``O_NONBLOCK``: opening a FIFO that has
no writer for reading returns at once instead of waiting for one; ``O_NOFOLLOW`` where
a link is not expected), takes regular files only (``fstat``, after the open, so the
check and the read are of the same file), and reads at most ``max_bytes``.
:func:`load_foreign` parses JSON or YAML from it with a depth bound.
:class:`Complaints` makes each (file, problem) cost one log line, however often the
dir is read again. Running as root, file permissions do not stop a read
(``CAP_DAC_OVERRIDE``), so an "unreadable" file is one the kernel refuses otherwise.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path
from typing import Any

MAX_BYTES = 4 * 1024 * 1024  # a CDI spec for 1,000 devices is ~0.5 MiB
MAX_DEPTH = 64  # a CDI spec nests 6 deep; a label file is flat
MAX_NODES = 200_000  # YAML values, each alias counted as all it names

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symlink",
}


class ForeignFileError(ValueError):
    """Why a file could not be read or parsed, in a few words (the path is the caller's);
    ``missing``: there is no such file."""

    def __init__(self, reason: str, *, missing: bool = False) -> None:
        super().__init__(reason)
        self.missing = missing


def read_foreign(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES, follow: bool = False
) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them, opened
    without blocking (a FIFO with no writer blocks a plain ``open()`` for ever); raises
    ForeignFileError (a ValueError) saying why not: what is there when it is no regular
    file (a FIFO, a socket, a device, a symlink loop), too large, an OSError.
    ``follow``: a symlink is followed (a ConfigMap's files are links); else refused."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as e:
        raise ForeignFileError(_os_reason(e, path, follow), missing=True) from None
    except OSError as e:
        raise ForeignFileError(_os_reason(e, path, follow)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise ForeignFileError(f"{kind}, not a regular file")
        if info.st_size > max_bytes:
            raise ForeignFileError(f"{info.st_size} bytes, more than the {max_bytes} read")
        chunks, size = [], 0
        while size <= max_bytes:  # a file growing while read is cut at the bound too
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise ForeignFileError(f"more than {max_bytes} bytes")
        return b"".join(chunks)
    except OSError as e:
        raise ForeignFileError(_os_reason(e, path, follow)) from None
    finally:
        os.close(fd)


def _os_reason(e: OSError, path: str | os.PathLike[str], follow: bool) -> str:
    """Why open() failed, naming what is there when it is no regular file (a socket
    fails to open with ENXIO; a link with ELOOP under O_NOFOLLOW, a loop always)."""
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except OSError as again:
        if again.errno == errno.ELOOP:
            return "a symlink loop"
        return e.strerror or str(e)
    except ValueError:  # a NUL in the path
        return "a path with a NUL byte"
    if stat.S_ISLNK(info.st_mode):
        return "a symlink (not followed here)"
    if not stat.S_ISREG(info.st_mode):
        return f"{_KINDS.get(stat.S_IFMT(info.st_mode), 'something')}, not a regular file"
    return e.strerror or str(e)


def load_foreign(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    follow: bool = False,
    kind: str = "",
) -> Any:
    """The JSON (``kind`` "json", or ``*.json``) or YAML (else) document in ``path``, read with
    :func:`read_foreign`; ForeignFileError when it cannot be read, is not UTF-8, does
    not parse, or nests deeper than ``max_depth``."""
    data = read_foreign(path, max_bytes=max_bytes, follow=follow)
    as_json = kind == "json" or (not kind and Path(path).suffix == ".json")
    return parse_foreign(data, as_json=as_json, max_depth=max_depth)


def parse_foreign(data: bytes, *, as_json: bool, max_depth: int = MAX_DEPTH) -> Any:
    """JSON or YAML from bytes another wrote, depth bounded; ForeignFileError otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ForeignFileError(f"not UTF-8 (a bad byte at offset {e.start})") from None
    if as_json:
        import json  # here: a start that reads no JSON file never loads it (issue 35)

        try:
            doc = json.loads(text)
        except RecursionError:
            raise ForeignFileError(f"nested deeper than {max_depth} levels") from None
        except ValueError as e:  # JSONDecodeError; int() of too many digits
            raise ForeignFileError(f"not JSON: {e}") from None
        if _depth_over(doc, max_depth):
            raise ForeignFileError(f"nested deeper than {max_depth} levels")
        return doc
    from hetero_dp.kits.yamlread import YamlRefused, load_yaml

    try:
        doc, _surprises = load_yaml(text, max_nodes=MAX_NODES, max_depth=max_depth)
    except YamlRefused as e:
        raise ForeignFileError(str(e)) from None
    return doc


def _depth_over(doc: Any, limit: int) -> bool:
    """Whether ``doc`` (parsed JSON: no cycles) nests deeper than ``limit``; no recursion."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in value if isinstance(v, dict | list))
    return False


class Complaints:
    """One log line per (file, problem): a dir read at every publish must not repeat
    the same complaint. A file whose problem changes (or goes and comes back) is said
    again."""

    def __init__(self, log: logging.Logger, level: int = logging.WARNING) -> None:
        self.log, self.level = log, level
        self._said: dict[str, str] = {}

    def say(self, path: str | os.PathLike[str], problem: str, message: str) -> None:
        """Log ``message % (path, problem)`` unless this problem of ``path`` was said."""
        key = str(path)
        if self._said.get(key) == problem:
            return
        if len(self._said) > 10_000:  # a dir of junk: bounded memory, some repeats
            self._said.clear()
        self._said[key] = problem
        self.log.log(self.level, message, key, problem)

    def clear(self, path: str | os.PathLike[str]) -> None:
        """``path`` is fine now (a later problem is said again)."""
        self._said.pop(str(path), None)
