"""Atomic file writes: readers see the old file or the new one, never half of one.

The data goes to a temp file in the target's directory (same filesystem, so the
rename is atomic), is flushed and fsynced, gets its mode, and is renamed over
the target; then the directory is fsynced so the rename survives a power cut.
A process killed at any point leaves the previous file intact; at worst a temp
file named ``.<name>.<random>.tmp`` stays behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: str | bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` through a temp file in the same dir, fsync, rename.

    ``mode`` is applied exactly (the umask does not narrow it). Raises ``OSError``
    if the directory is missing or not writable; the target is then untouched.
    """
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    # Hidden and ending in .tmp: spec loaders that pick files by extension
    # (CDI reads *.json and *.yaml) never see a half-written temp file.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
