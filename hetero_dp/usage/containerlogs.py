"""Container ID -> pod, namespace and container name, from the names of the kubelet's
legacy log links in ``/var/log/containers``.

Neither the pod-resources ``List`` nor the device checkpoint names a container ID,
and a process's cgroup names only that ID (and its pod's UID); so in a pod with two
containers holding the same device, the cgroup alone cannot say which one a
process is in. The kubelet itself writes the missing link: after it starts a
container it makes ``/var/log/containers/<pod>_<namespace>_<container>-<container
ID>.log``, a symlink to the container's log (kubernetes/kubernetes
``pkg/kubelet/kuberuntime/kuberuntime_container.go``, ``startContainer``, and
``legacy.go``: ``legacyLogSymlink``, ``logSymlink``), and removes it with the
container (``removeContainerLog``). Only the names are read, never the links'
targets. Pod and namespace names hold no ``_`` (DNS subdomain and label), a
container name no ``_`` (DNS label), a runtime's container ID no ``-``: a name
splits one way only. The kubelet cuts a name longer than 255 bytes (ext4's limit),
which cuts the ID: such a link, or one of another form, is skipped. It makes no
link when the container's log file does not exist (a runtime logging elsewhere):
then such a process stays attributed to no one.

Read with bounds (:data:`MAX_ENTRIES` names), again only when the directory's mtime
moved (a link made or removed changes it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hetero_dp.usage.view import Owner

DEFAULT_DIR = "/var/log/containers"
MAX_ENTRIES = 100_000  # names read at most per scan; a node runs some hundreds
SUFFIX = ".log"


def parse(name: str) -> tuple[str, Owner] | None:
    """(container ID, its owner) from one link's name, or None for another form."""
    if not name.endswith(SUFFIX):
        return None
    parts = name[: -len(SUFFIX)].split("_")
    if len(parts) != 3 or not all(parts):
        return None
    pod, namespace, rest = parts
    container, dash, cid = rest.rpartition("-")
    if not dash or not container or len(cid) < 12 or not cid.isalnum():
        return None
    return cid, Owner(pod, namespace, container)


@dataclass
class ContainerNames:
    """The links of one directory, by container ID, cached by the directory's mtime."""

    path: str = DEFAULT_DIR

    def __post_init__(self) -> None:
        self._stamp: tuple[int, int] | None = None
        self._by_id: dict[str, Owner] = {}
        self.problem = ""  # why the last scan read nothing ('' when it read)

    def read(self) -> dict[str, Owner]:
        """Container ID -> owner (blocking: call from a worker thread)."""
        if not self.path:
            return {}
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_ino)
            if stamp == self._stamp:
                return self._by_id
            by_id: dict[str, Owner] = {}
            with os.scandir(self.path) as it:
                for n, entry in enumerate(it):
                    if n >= MAX_ENTRIES:
                        break
                    found = parse(entry.name)
                    if found is not None:
                        by_id[found[0]] = found[1]
        except OSError as e:
            self._stamp, self._by_id = None, {}
            self.problem = f"{self.path}: {e.strerror}"
            return {}
        self._stamp, self._by_id, self.problem = stamp, by_id, ""
        return by_id
