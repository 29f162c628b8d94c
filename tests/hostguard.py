"""A guard over the whole test run: no test may create, change or remove files in the
host's CDI and kubelet dirs.

A CDI spec a test leaves in /var/run/cdi advertises fake GPUs to the container runtime
of a machine that is also a node (container runtimes read /etc/cdi and /var/run/cdi:
the CDI specification, github.com/cncf-tags/container-device-interface, SPEC.md); a
socket left in /var/lib/kubelet/device-plugins is dialled by the kubelet. Each test's
setup, call and teardown are bracketed by a snapshot of those trees, and a difference
fails that test (an error at its teardown), naming the files. The deployment suite's
podman keeps its own state elsewhere (/var/lib/containers, /run/containers).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

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


class HostGuard:
    """The pytest plugin: register one per run (tests/conftest.py does)."""

    def __init__(self, roots: Iterable[Path] = HOST_DIRS) -> None:
        self.roots = tuple(roots)
        self.before: dict[str, Snapshot] = {}

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
