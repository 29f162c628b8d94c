"""Attribution for one daemon: one refresh per scrape, each reading cheap and bounded.

On whenever the pod-resources socket exists; without it, or while the kubelet does
not answer, a refresh returns None (``/metrics`` answers as before), the log says
once why, and the next refresh that gets an answer turns it on again with a line.
The checkpoint is parsed again only when it changed (its inode, size or mtime); the
PIDs the backends named are looked up in one worker thread, each process's cgroup file
read once (:class:`~hetero_dp.usage.cgroups.CgroupCache`). Each problem costs only
its own item and is logged once until it clears: a vanished PID, an unreadable cgroup
file, a checkpoint that cannot be used.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from hetero_dp.model.device import Sample
from hetero_dp.model.usage import ProcessUsage
from hetero_dp.usage import checkpoint
from hetero_dp.usage.cgroups import CgroupCache, ContainerRef, Vanished
from hetero_dp.usage.containerlogs import DEFAULT_DIR as DEFAULT_LOGS
from hetero_dp.usage.containerlogs import ContainerNames
from hetero_dp.usage.neighbours import FairShareWatch
from hetero_dp.usage.podresources import PodResourcesClient, PodResourcesUnavailable
from hetero_dp.usage.view import Inventory, Owner, Pod, View, build, owner_of_pid, pods_by_uid

log = logging.getLogger("hetero_dp.usage")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_PROC = "/proc"


@dataclass(frozen=True)
class Settings:
    """The ``attribution`` section, and the device checkpoint's path."""

    pod_resources_socket: str = DEFAULT_SOCKET
    proc_root: str = DEFAULT_PROC
    checkpoint: str = ""
    container_logs_dir: str = DEFAULT_LOGS


class OnceLog:
    """A line per kind of problem, logged when it starts and again only after it
    cleared (:meth:`clear`)."""

    def __init__(self) -> None:
        self.active: dict[str, str] = {}

    def note(self, kind: str, message: str, level: int = logging.WARNING) -> None:
        if self.active.get(kind) != message:
            if kind not in self.active:
                log.log(level, "%s", message)
            self.active[kind] = message

    def clear(self, kind: str, message: str = "") -> None:
        if self.active.pop(kind, None) is not None and message:
            log.info("%s", message)


class Attribution:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = PodResourcesClient(settings.pod_resources_socket)
        self.notes = OnceLog()
        self.watch = FairShareWatch()
        self.cgroups = CgroupCache(settings.proc_root)
        self.names = ContainerNames(settings.container_logs_dir)
        self._names: dict[str, Owner] = {}  # container ID -> its container (log links)
        self.view: View | None = None
        self._pods: dict[str, Pod] = {}
        self._refs: dict[int, ContainerRef | None] = {}
        self._entries: list[checkpoint.Entry] = []
        self._stamp: tuple[int, int, int] | None = None
        self._on: bool | None = None  # unknown until the first refresh
        self._lock = asyncio.Lock()

    async def refresh(
        self, inventory: Inventory, usages: Iterable[ProcessUsage], pids: Iterable[int] = ()
    ) -> View | None:
        """Read everything once and join it; None while attribution is off. Two scrapes
        at once refresh one after the other (the caches are not shared between threads);
        anything unforeseen costs this refresh (one ERROR line per kind), never the scrape."""
        async with self._lock:
            try:
                return await self._refresh(inventory, usages, pids)
            except Exception as e:  # the scrape answers without attribution
                self.view = None
                self.notes.note(
                    "failed", f"attribution failed, left out of this scrape: {e!r}", logging.ERROR
                )
                return None

    async def _refresh(
        self, inventory: Inventory, usages: Iterable[ProcessUsage], pids: Iterable[int]
    ) -> View | None:
        try:
            listed = await self.client.list(self._checkpoint_stamp())
        except PodResourcesUnavailable as e:
            self.view, self._pods, self._refs = None, {}, {}
            if self._on is not False:  # once per time off (and at start)
                log.info("attribution off: %s; /metrics goes on without it", e)
            self._on = False
            return None
        if self._on is not True:
            log.info(
                "attribution on: the kubelet's pod-resources API answers on %s",
                self.settings.pod_resources_socket,
            )
            self._on = True
        usages = list(usages)
        wanted = {u.pid for u in usages} | set(pids)
        entries, refs, names = await asyncio.to_thread(self._read, wanted)
        view = build(inventory, listed, entries, usages, refs, names)
        self._pods = pods_by_uid(listed, entries)
        self._refs, self._names = refs, names
        self.view = view
        self.watch.check(view.uses)
        self.notes.clear("failed")
        return view

    def _read(
        self, pids: set[int]
    ) -> tuple[list[checkpoint.Entry], dict[int, ContainerRef | None], dict[str, Owner]]:
        return self._checkpoint(), self._cgroups(pids), self._container_names()

    def _container_names(self) -> dict[str, Owner]:
        names = self.names.read()
        if self.names.problem:
            self.notes.note(
                "logs",
                f"attribution: no container log links ({self.names.problem}): a process in "
                "a pod with two containers holding the same device is attributed to no one",
                logging.INFO,
            )
        else:
            self.notes.clear("logs")
        return names

    def _checkpoint_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.settings.checkpoint)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _checkpoint(self) -> list[checkpoint.Entry]:
        path = self.settings.checkpoint
        try:
            st = os.stat(path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if stamp != self._stamp:
                self._entries, skipped = checkpoint.read(path)
                self._stamp = stamp
                if skipped:
                    self.notes.note(
                        "entries", f"attribution: {skipped} entries of {path} of an unknown shape"
                    )
                else:
                    self.notes.clear("entries")
        except (OSError, checkpoint.CheckpointError) as e:
            self._entries, self._stamp = [], None
            why = e if isinstance(e, checkpoint.CheckpointError) else f"{path}: {e.strerror}"
            self.notes.note(
                "checkpoint", f"attribution: no process is attributed: the device checkpoint {why}"
            )
            return []
        self.notes.clear("checkpoint", f"attribution: the device checkpoint {path} reads again")
        return self._entries

    def _cgroups(self, pids: set[int]) -> dict[int, ContainerRef | None]:
        refs: dict[int, ContainerRef | None] = {}
        vanished, unreadable = [], []
        for pid in sorted(pids):
            try:
                refs[pid] = self.cgroups.lookup(pid)
            except Vanished:
                refs[pid] = None
                vanished.append(pid)
            except OSError as e:
                refs[pid] = None
                unreadable.append(f"{pid} ({e.strerror})")
        self.cgroups.keep_only(pids)
        root = self.settings.proc_root
        if vanished:
            self.notes.note(
                "vanished",
                f"attribution: {len(vanished)} processes ended before {root}/<pid>/cgroup "
                f"was read (first: {vanished[0]}); attributed to no one",
                logging.INFO,
            )
        else:
            self.notes.clear("vanished")
        if unreadable:
            self.notes.note(
                "unreadable",
                f"attribution: cannot read {root}/<pid>/cgroup of {', '.join(unreadable[:3])}",
            )
        else:
            self.notes.clear("unreadable")
        return refs

    def owner_of(self, sample: Sample) -> Owner | None:
        """The container a sample is about, where attribution knows it: a process's
        (``pid``), or a device's while one container holds it whole (``device_id``)."""
        view = self.view
        if view is None:
            return None
        if sample.pid is not None:
            ref = self._refs.get(sample.pid)
            return owner_of_pid(view, self._pods, sample.pid, ref, sample.device_id, self._names)
        if sample.device_id:
            return view.sole.get(sample.device_id)
        return None
