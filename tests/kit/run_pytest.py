"""Run an author's test file with pytest in a fresh interpreter, as an author would: no
pytest config of theirs (pytest-asyncio in its default strict mode: hetero-dp's pytest
plugin runs the async tests), the file's own dir as the root, no cache written."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def run_pytest(
    test_file: Path, *, root: Path, cwd: Path, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(root),
            str(test_file),
        ],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
