"""write_atomic: a killed writer leaves the old file; readers never see half a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hetero_dp.kits.atomic import write_atomic
from tests.cdi.crash import REPO, FrozenWriter

OLD = b"old content\n" * 1000
NEW = b"new content, longer\n" * 5000


def _temps(d: Path) -> list[Path]:
    return [p for p in d.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("call", ["fsync", "replace"])
def test_kill_before_rename_leaves_previous_file(tmp_path: Path, call: str) -> None:
    target = tmp_path / "spec.json"
    write_atomic(target, OLD)
    code = f"from hetero_dp.kits.atomic import write_atomic; write_atomic({str(target)!r}, {NEW!r})"
    child = FrozenWriter(call, code)
    # Frozen between writing and renaming: the new bytes sit in a hidden temp file.
    (tmp,) = _temps(tmp_path)
    assert tmp.name.startswith(".spec.json.")
    if call == "replace":
        assert tmp.read_bytes() == NEW  # written and fsynced, not yet renamed
    assert target.read_bytes() == OLD
    assert child.kill() == -signal.SIGKILL
    assert target.read_bytes() == OLD
    # The next write still works and replaces the file whole.
    write_atomic(target, NEW)
    assert target.read_bytes() == NEW


def test_finished_write_replaces_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "f"
    write_atomic(target, "héllo")
    write_atomic(target, "bye")
    assert target.read_text(encoding="utf-8") == "bye"
    assert _temps(tmp_path) == []


def test_mode_is_exact_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "a", b"x", 0o644)
        write_atomic(tmp_path / "b", b"x", 0o600)
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b").stat().st_mode & 0o777 == 0o600


def test_failed_write_leaves_no_temp_and_old_file(tmp_path: Path) -> None:
    target = tmp_path / "f"
    write_atomic(target, OLD)
    with pytest.raises(TypeError):
        write_atomic(target, 12345)  # type: ignore[arg-type]
    assert target.read_bytes() == OLD
    assert _temps(tmp_path) == []


def test_missing_dir_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "nope" / "f", b"x")


_WRITER = textwrap.dedent(
    """
    import sys
    from hetero_dp.kits.atomic import write_atomic
    target, n = sys.argv[1], int(sys.argv[2])
    a, b = b"a" * 300_000, b"b" * 200_003
    for i in range(n):
        write_atomic(target, a if i % 2 else b)
    """
)


def test_readers_never_see_half_a_file(tmp_path: Path) -> None:
    target = tmp_path / "f"
    a, b = b"a" * 300_000, b"b" * 200_003
    write_atomic(target, a)
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(target), "150"],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    reads = 0
    inodes = set()
    try:
        while writer.poll() is None:
            with open(target, "rb") as f:
                inodes.add(os.fstat(f.fileno()).st_ino)
                data = f.read()
            assert data in (a, b), f"torn read: {len(data)} bytes"
            reads += 1
    finally:
        writer.kill() if writer.poll() is None else None
        writer.wait()
    assert writer.returncode == 0
    # The reads really overlapped the writes: they saw several generations of the file.
    assert len(inodes) > 1, (reads, len(inodes))
