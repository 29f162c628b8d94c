#!/usr/bin/env python3
"""Install checkov (the manifest security scan in tests/deploy) once, into .cache/tools/.

checkov comes from PyPI, pinned, into a virtual environment of its own:

    .cache/tools/checkov-<version>/bin/checkov

not into the project's environment, because it brings some sixty packages and pins
older versions of ones the project's tools use (``packaging<24``: pip's resolver would
downgrade packaging 26 under build and pytest). kube-linter, the lighter scanner, has no
PyPI or Debian package.

It prints the path. Where the interpreter cannot make a venv or PyPI is unreachable it
says so and exits 0, and the scan skips naming this script; under CI=true it exits 1
instead, so a CI run never passes without the scan.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "3.3.30"
TOOLS = ROOT / ".cache" / "tools"
VENV = TOOLS / f"checkov-{VERSION}"
CHECKOV = VENV / "bin" / "checkov"
DONE = VENV / ".complete"


def unavailable(why: str) -> int:
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    print(f"fetch_checkov: checkov unavailable: {why}", file=sys.stderr)
    if in_ci:
        print("fetch_checkov: CI=true, so this is an error", file=sys.stderr)
        return 1
    print("fetch_checkov: the security scan in tests/deploy will skip", file=sys.stderr)
    return 0


def fetch() -> int:
    """A venv at its final path (its scripts name it), marked complete only at the end:
    one left half-made by a killed install is made again."""
    shutil.rmtree(VENV, ignore_errors=True)
    python = str(VENV / "bin" / "python")
    for step in (
        [sys.executable, "-m", "venv", str(VENV)],
        [python, "-m", "pip", "install", "-q", f"checkov=={VERSION}"],
    ):
        proc = subprocess.run(step, capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            return unavailable(f"{' '.join(step[1:])} failed: {proc.stderr.strip()[-600:]}")
    DONE.touch()
    return 0


def main() -> int:
    if not DONE.is_file():
        code = fetch()
        if code or not DONE.is_file():
            return code
    print(CHECKOV)
    return 0


if __name__ == "__main__":
    sys.exit(main())
