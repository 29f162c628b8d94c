"""A process's pod and container, from ``/proc/<pid>/cgroup``.

The kubelet puts each container in a cgroup under its pod's (the kubelet's cgroup
naming, ``pkg/kubelet/cm/cgroup_manager_linux.go``; the runtimes' scope names,
containerd's ``cri-containerd-``, CRI-O's ``crio-``, dockershim's ``docker-``):

- cgroupfs driver: ``.../kubepods/<qos>/pod<uid>/<container id>`` (``crio-<id>``
  under CRI-O), guaranteed pods without the ``<qos>`` level;
- systemd driver: ``.../kubepods.slice/kubepods-<qos>.slice/
  kubepods-<qos>-pod<uid, '_' for '-'>.slice/<runtime>-<container id>.scope``.

v1 lines (``N:controllers:path``) and the v2 line (``0::path``) name the same path
(cgroups(7)); the v2 line is read first. Any other form (a process outside
Kubernetes, CRI-O's ``crio-conmon-`` monitor, a layout of a runtime not named here)
belongs to no container: the caller attributes it to no one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

#: More than any real cgroup file (a line per v1 hierarchy); a bigger one is not one.
MAX_CGROUP_FILE = 64 * 1024

_HEX = "[0-9a-f]"
_UID = "{0}{{8}}{1}{0}{{4}}{1}{0}{{4}}{1}{0}{{4}}{1}{0}{{12}}"
_POD_CGROUPFS = re.compile(rf"^pod({_UID.format(_HEX, '-')})$")
_POD_SYSTEMD = re.compile(rf"^kubepods(?:-[a-z]+)?-pod({_UID.format(_HEX, '_')})\.slice$")
_CONTAINER_CGROUPFS = re.compile(r"^(?:(?:crio|docker|cri-containerd)-)?([0-9a-f]{64})$")
_CONTAINER_SYSTEMD = re.compile(r"^(?:cri-containerd|crio|docker)-([0-9a-f]{64})\.scope$")


@dataclass(frozen=True)
class ContainerRef:
    """The pod UID (with dashes, as the API server writes it) and the runtime's
    container ID of a process."""

    pod_uid: str
    container_id: str


def parse_path(path: str) -> ContainerRef | None:
    """The pod and container a cgroup path names, or None for any other form."""
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts[:-1]):
        if not any(p.startswith("kubepods") for p in parts[: i + 1]):
            continue
        nxt = parts[i + 1]
        m = _POD_CGROUPFS.match(part)
        if m:
            c = _CONTAINER_CGROUPFS.match(nxt)
            return ContainerRef(m.group(1), c.group(1)) if c else None
        m = _POD_SYSTEMD.match(part)
        if m:
            c = _CONTAINER_SYSTEMD.match(nxt)
            return ContainerRef(m.group(1).replace("_", "-"), c.group(1)) if c else None
    return None


def parse_cgroup(text: str) -> ContainerRef | None:
    """The pod and container of a ``/proc/<pid>/cgroup`` file's text, or None."""
    paths: list[tuple[bool, str]] = []
    for line in text.splitlines():
        hierarchy, sep, rest = line.partition(":")
        _controllers, sep2, path = rest.partition(":")
        if sep and sep2 and hierarchy.isdigit():
            paths.append((hierarchy != "0", path))  # the v2 line first
    for _v1, path in sorted(paths, key=lambda p: p[0]):
        ref = parse_path(path)
        if ref is not None:
            return ref
    return None


class Vanished(Exception):
    """The process ended before its cgroup was read."""


def read_cgroup(proc_root: str, pid: int) -> ContainerRef | None:
    """``<proc_root>/<pid>/cgroup`` parsed; :class:`Vanished` when the process is
    gone, OSError when the file cannot be read, None for a form of no container."""
    path = os.path.join(proc_root, str(pid), "cgroup")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except (FileNotFoundError, ProcessLookupError):
        raise Vanished(pid) from None
    try:
        data = os.read(fd, MAX_CGROUP_FILE + 1)
    except ProcessLookupError:  # /proc answers ESRCH for a process gone after the open
        raise Vanished(pid) from None
    finally:
        os.close(fd)
    if len(data) > MAX_CGROUP_FILE:
        return None
    return parse_cgroup(data.decode("utf-8", "replace"))


class CgroupCache:
    """:func:`read_cgroup` once per process: a process seen before is known by its
    ``/proc/<pid>`` dir's inode (one ``stat``, a tenth of the read of a real
    ``cgroup`` file, where the kernel builds the path). procfs gives a new process
    a new inode, so a reused PID is read afresh; a container's processes do not move
    to another pod's cgroup, which is what the cache takes for granted."""

    def __init__(self, proc_root: str) -> None:
        self.proc_root = proc_root
        self._known: dict[int, tuple[int, ContainerRef | None]] = {}
        self.reads = 0  # cgroup files read, for tests and the benchmark

    def lookup(self, pid: int) -> ContainerRef | None:
        """As :func:`read_cgroup` (:class:`Vanished`, OSError, None)."""
        try:
            inode = os.stat(os.path.join(self.proc_root, str(pid))).st_ino
        except (FileNotFoundError, ProcessLookupError):
            self._known.pop(pid, None)
            raise Vanished(pid) from None
        known = self._known.get(pid)
        if known is not None and known[0] == inode:
            return known[1]
        self.reads += 1
        ref = read_cgroup(self.proc_root, pid)
        self._known[pid] = (inode, ref)
        return ref

    def keep_only(self, pids: set[int]) -> None:
        """Forget the processes not asked about this time (bounds the cache)."""
        for pid in [p for p in self._known if p not in pids]:
            del self._known[pid]
