"""A guard over the whole test run: no test may create, change or remove files in the
host's CDI and kubelet dirs, nor leave files in the temp dir.

A CDI spec a test leaves in /var/run/cdi advertises fake GPUs to the container runtime
of a machine that is also a node (container runtimes read /etc/cdi and /var/run/cdi:
the CDI specification, github.com/cncf-tags/container-device-interface, SPEC.md); a
socket left in /var/lib/kubelet/device-plugins is dialled by the kubelet. Each test's
setup, call and teardown are bracketed by a snapshot of those trees, and a difference
fails that test (an error at its teardown), naming the files. The deployment suite's
podman keeps its own state elsewhere (/var/lib/containers, /run/containers).

On a node the kubelet writes under /var/lib/kubelet all the time (its sockets, pod
dirs, checkpoints), so a snapshot of the real dirs would blame whichever test runs. As
root, the run therefore takes a private mount namespace (unshare(2) CLONE_NEWNS, mounts
made private as mount_namespaces(7) says) in which every host dir that exists is an empty
tmpfs: the tests and their children see and write only those, the host's dirs are never
reached, and what the guard sees changing there is the run's own doing. Without the
privilege (unshare fails with EPERM), the guard keeps to the dirs this user can write:
another process's writes to a dir we cannot write are not ours to blame.

The temp dir: the run gets a dir of its own under /tmp (TMPDIR, so that subprocesses
and pytest's tmp_path, its basetemp, land there too) and removes it at the end. A file
or dir left directly in it, or a dir that short_tempdir made in /tmp (short socket
paths), still there when the run ends fails the run, naming the test during which it
appeared (not at that test's teardown: a module-scoped fixture's dir lives on until
the module's last test).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from hetero_dp.testing.runner import SHORT_TEMPDIR_LOG, SHORT_TEMPDIRS

#: The host dirs a device plugin writes to on a node: CDI specs (the daemon's default
#: cdi.dir and the other dir runtimes read), the kubelet's sockets, registry, checkpoints.
HOST_DIRS = (Path("/var/run/cdi"), Path("/etc/cdi"), Path("/var/lib/kubelet"))

Snapshot = dict[str, tuple[int, int, int]]


def snapshot(roots: Iterable[Path]) -> Snapshot:
    """Each root and every entry under it: path -> (inode, size, mtime in ns). A root
    counts too: a test that makes a missing /var/run/cdi, or writes a spec there and
    removes it before its end (a spec the runtime could read meanwhile), changes it."""
    seen: Snapshot = {}
    for root in roots:
        try:
            st = os.lstat(root)
        except OSError:
            pass
        else:
            seen[str(root)] = (st.st_ino, st.st_size, st.st_mtime_ns)
        for top, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                path = os.path.join(top, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                seen[path] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return seen


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    made = [f"created {p}" for p in sorted(after.keys() - before.keys())]
    gone = [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    changed = [
        f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]
    ]
    return made + gone + changed


# <linux/sched.h> and <sys/mount.h>
CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18


def isolate(roots: Iterable[Path]) -> str | None:
    """Enter a private mount namespace where each existing root is an empty tmpfs.
    None when done, else the reason it could not be (the caller falls back). Call it
    before the process starts threads: unshare(CLONE_NEWNS) refuses a process whose
    threads share its filesystem context (EINVAL)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def call(what: str, rc: int) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    try:
        call("unshare(CLONE_NEWNS)", libc.unshare(CLONE_NEWNS))
        # Without this, mounts below propagate back to the host's namespace on systems
        # where / is shared (systemd's default).
        call("make / private", libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None))
        for root in roots:
            if root.is_dir() and not root.is_symlink():
                call(
                    f"mount a tmpfs on {root}",
                    libc.mount(b"tmpfs", bytes(root), b"tmpfs", 0, b"mode=0755,size=64m"),
                )
    except OSError as e:
        return str(e.strerror)
    return None


def writable(root: Path) -> bool:
    """Whether this user could change ``root`` (or make it, from its nearest parent)."""
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return os.access(probe, os.W_OK)


class HostGuard:
    """The pytest plugin: register one per run (tests/conftest.py does)."""

    def __init__(self, roots: Iterable[Path] = HOST_DIRS, *, private: bool = False) -> None:
        self.roots = tuple(roots)
        self.before: dict[str, Snapshot] = {}
        self.note = ""
        if private:
            why = isolate(self.roots)
            if why is None:
                self.note = "the host's CDI and kubelet dirs are private tmpfs mounts"
            else:
                self.roots = tuple(r for r in self.roots if writable(r))
                self.note = (
                    f"no private mount namespace ({why}); guarding the dirs this user can "
                    f"write: {', '.join(map(str, self.roots)) or 'none'}"
                )

    def pytest_report_header(self) -> str:
        return f"host guard: {self.note}" if self.note else ""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.before[item.nodeid] = snapshot(self.roots)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        # A wrapper: the check runs after every fixture of the test was torn down.
        try:
            result = yield
        except BaseException:
            self.check(item)
            raise
        self.check(item)
        return result

    def check(self, item: pytest.Item) -> None:
        before = self.before.pop(item.nodeid, None)
        if before is None:
            return
        found = changes(before, snapshot(self.roots))
        if found:
            pytest.fail(
                "this test wrote to the host's CDI or kubelet dirs; a test keeps to its "
                "temp dirs (give the daemon cdi.dir, kubeletDir, pluginsRegistryDir):\n  "
                + "\n  ".join(found),
                pytrace=False,
            )


class TmpGuard:
    """The run's own temp dir (see the module's docstring). Made before any test asks
    for a temp path: ``tempfile`` reads TMPDIR on first use, pytest's tmp_path too."""

    def __init__(self, config: pytest.Config) -> None:
        self.base = tempfile.mkdtemp(prefix="hdp-tests-", dir="/tmp")
        if not config.option.basetemp:
            # tmp_path under it, no longer than pytest's own /tmp/pytest-of-<user>/pytest-N
            # (some tests put unix sockets there, 108 bytes at most)
            config.option.basetemp = os.path.join(self.base, "t")
        self.saved = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = self.base
        tempfile.tempdir = None  # recomputed from TMPDIR
        # short_tempdir in the processes the tests start notes its dirs here
        self.log = os.path.join(self.base, ".short-tempdirs")
        self.saved_log = os.environ.get(SHORT_TEMPDIR_LOG)
        os.environ[SHORT_TEMPDIR_LOG] = self.log
        self.before: dict[str, set[str]] = {}
        self.pending: dict[str, str] = {}  # entry -> the test during which it appeared
        self.left: list[str] = []

    def entries(self) -> set[str]:
        own = {
            n
            for n in os.listdir(self.base)
            if n not in ("t", ".short-tempdirs") and not n.startswith("pytest-of-")
        }
        try:
            with open(self.log, encoding="utf-8") as f:
                elsewhere = {line.strip() for line in f if line.strip()}
        except FileNotFoundError:
            elsewhere = set()
        short = {str(p) for p in SHORT_TEMPDIRS} | elsewhere
        return own | {p for p in short if os.path.lexists(p)}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.before[item.nodeid] = self.entries()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        # Each entry is noted with the test during which it appeared; one a module- or
        # session-scoped fixture makes at its first test's setup is removed by its own
        # teardown later, so only what is still there at the end of the run was left.
        try:
            return (yield)
        finally:
            now = self.entries()
            for name in now - self.before.pop(item.nodeid, now):
                self.pending.setdefault(name, item.nodeid)
            self.pending = {n: who for n, who in self.pending.items() if n in now}

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        left = {n: who for n, who in self.pending.items() if n in self.entries()}
        for name in left:
            shutil.rmtree(os.path.join(self.base, name), ignore_errors=True)
        self.left = [f"{name} (it appeared during {who})" for name, who in sorted(left.items())]
        if self.left and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.left:
            terminalreporter.section("files left in the temp dir", red=True)
            terminalreporter.line(
                "remove what a test makes (a fixture's finally, or tmp_path); the run fails:"
            )
            for line in self.left:
                terminalreporter.line(f"  {line}")

    def pytest_unconfigure(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)
        if self.saved is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = self.saved
        if self.saved_log is None:
            os.environ.pop(SHORT_TEMPDIR_LOG, None)
        else:
            os.environ[SHORT_TEMPDIR_LOG] = self.saved_log
        tempfile.tempdir = None
