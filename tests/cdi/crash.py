"""Run a real write in a child process and SIGKILL it at a chosen system call.

The child installs a profiler (``sys.setprofile``) that watches for one builtin
(``os.fsync`` or ``os.replace``) called from ``hetero_dp/kits/atomic.py``, reports
"at <call>" on stdout and blocks on stdin; the parent checks the files while the
child is frozen just before that call, then kills it with SIGKILL. Nothing of
ours is patched: the write runs unchanged, and the process really dies mid-write.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
    """
    import os, sys

    stop_at = {"fsync": os.fsync, "replace": os.replace}[sys.argv[1]]

    # Only the call made by write_atomic itself: imports call os.replace too
    # (when they write .pyc files).
    ours = os.path.join("hetero_dp", "kits", "atomic.py")

    def watch(frame, event, arg):
        if event == "c_call" and arg is stop_at and frame.f_code.co_filename.endswith(ours):
            sys.setprofile(None)
            os.write(1, ("at " + sys.argv[1] + "\\n").encode())
            os.read(0, 1)  # frozen here until killed

    sys.setprofile(watch)
    exec(sys.argv[2])
    os.write(1, b"finished\\n")
    """
)


class FrozenWriter:
    """A child process frozen just before ``call`` inside ``code``."""

    def __init__(self, call: str, code: str, timeout: float = 30.0) -> None:
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, call, code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode() if ready else ""
        if line.strip() != f"at {call}":
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"child did not stop at {call}: {line!r} {err.decode()}")

    def kill(self) -> int:
        """SIGKILL the frozen child; returns its exit status (-9)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        rc = self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()
        return rc
