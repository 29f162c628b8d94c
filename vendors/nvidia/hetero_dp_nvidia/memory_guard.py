"""The memory guard: how full a shared GPU's framebuffer is, against the replicas' share.

Time-slicing gives every replica the whole GPU's memory: one pod can fill it
and its neighbours fail to allocate while Kubernetes shows every pod Running.
MPS caps each client's pinned memory, but the GPU can still fill up. So for
every GPU with replicas (any strategy) the guard reports, from NVML:

- ``hetero_dp_shared_memory_used_bytes`` (per GPU) and
  ``hetero_dp_shared_memory_process_used_bytes`` (per process, where NVML can tell:
  ``nvmlDeviceGetComputeRunningProcesses`` reports ``usedGpuMemory`` as not
  available under some drivers and modes, and those processes are left out);
- ``hetero_dp_shared_memory_total_bytes`` and ``hetero_dp_shared_memory_fair_share_bytes``
  (total / replicas);

and, under time-slicing, a warning in the log (and in ``hetero-dp doctor``) when
a GPU is more than 90 % used, once per crossing, with a line when it recovers.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pynvml

from hetero_dp import Check, Device, Sample, SharingConfig, is_replica, replica_base

from .discovery import GpuInfo, NodeInfo
from .nvml import NVMLError
from .usage import running_processes

log = logging.getLogger("hetero_dp_nvidia.memory")
THRESHOLD = 0.9


def replicas_per_gpu(advertised: Iterable[Device]) -> dict[str, int]:
    """Physical GPU ID -> its replicas, for the GPUs that are shared."""
    counts = Counter(replica_base(d.id) for d in advertised if is_replica(d.id))
    return dict(counts)


def _memory(handle: Any) -> tuple[int, int] | None:
    try:
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    except NVMLError:
        return None
    return int(mem.total), int(mem.used)


def _processes(handle: Any) -> list[tuple[int, int]]:
    """(PID, bytes) of the compute and MPS client processes where NVML can tell."""
    try:
        procs = running_processes(handle)
    except NVMLError:
        return []  # no per-process view on this GPU now (usage.py logs why)
    return [(p.pid, p.memory) for p in procs if p.memory is not None]


class MemoryGuard:
    """Remembers which GPUs are shared (from the last discovery) and which are near full."""

    def __init__(self, threshold: float = THRESHOLD) -> None:
        self.threshold = threshold
        self._lock = threading.Lock()
        self._replicas: dict[str, int] = {}
        self._over: set[str] = set()

    def update(self, advertised: Iterable[Device]) -> None:
        with self._lock:
            self._replicas = replicas_per_gpu(advertised)

    def replicas(self, uuid: str) -> int:
        with self._lock:
            return self._replicas.get(uuid, 0)

    def samples(self, node: NodeInfo, sharing: SharingConfig) -> list[Sample]:
        out: list[Sample] = []
        for g in node.gpus:
            n = self.replicas(g.uuid)
            if not n or g.handle is None:
                continue
            mem = _memory(g.handle)
            if mem is None:
                continue
            total, used = mem
            labels = {"gpu": str(g.index), "UUID": g.uuid, "sharing_strategy": sharing.strategy}
            out += [
                Sample(
                    "hetero_dp_shared_memory_used_bytes",
                    used,
                    labels,
                    "Framebuffer used on a shared GPU (all its replicas together).",
                    device_id=g.uuid,
                ),
                Sample(
                    "hetero_dp_shared_memory_total_bytes",
                    total,
                    labels,
                    "Framebuffer of a shared GPU.",
                    device_id=g.uuid,
                ),
                Sample(
                    "hetero_dp_shared_memory_fair_share_bytes",
                    total // n,
                    {**labels, "replicas": str(n)},
                    "A shared GPU's framebuffer divided by its replicas.",
                    device_id=g.uuid,
                ),
            ]
            for pid, used_by in _processes(g.handle):
                out.append(
                    Sample(
                        "hetero_dp_shared_memory_process_used_bytes",
                        used_by,
                        {**labels, "pid": str(pid)},
                        "Framebuffer used by one process on a shared GPU (where NVML can tell).",
                        device_id=g.uuid,
                        pid=pid,
                    )
                )
        return out

    def check(self, gpu: GpuInfo, sharing: SharingConfig) -> None:
        """Log when a time-sliced GPU goes over the threshold, and when it comes back."""
        n = self.replicas(gpu.uuid)
        if not n or sharing.strategy != "time-slicing" or gpu.handle is None:
            return
        mem = _memory(gpu.handle)
        if mem is None or not mem[0]:
            return
        total, used = mem
        over = used > self.threshold * total
        with self._lock:
            was = gpu.uuid in self._over
            if over == was:
                return
            (self._over.add if over else self._over.discard)(gpu.uuid)
        if over:
            log.warning("%s", _over_message(gpu, total, used, n))
        else:
            log.info(
                "GPU %d (%s) under time-slicing is back below %d %% used (%d of %d MiB)",
                gpu.index,
                gpu.uuid,
                round(self.threshold * 100),
                used >> 20,
                total >> 20,
            )


def _over_message(gpu: GpuInfo, total: int, used: int, replicas: int) -> str:
    return (
        f"GPU {gpu.index} ({gpu.uuid}) under time-slicing is {100 * used / total:.0f} % used "
        f"({used >> 20} of {total >> 20} MiB; {replicas} replicas, a fair share is "
        f"{(total // replicas) >> 20} MiB each): its pods may fail to allocate memory"
    )


def guard_checks(
    node: NodeInfo, advertised: Iterable[Device], sharing: SharingConfig
) -> list[Check]:
    """``hetero-dp doctor``: a warning per time-sliced GPU over 90 % used."""
    if not sharing.enabled:
        return []
    replicas = replicas_per_gpu(advertised)
    checks = []
    for g in node.gpus:
        n = replicas.get(g.uuid, 0)
        if not n or g.handle is None:
            continue
        mem = _memory(g.handle)
        if mem is None or not mem[0]:
            continue
        total, used = mem
        name = f"gpu {g.index} shared memory"
        if sharing.strategy == "time-slicing" and used > THRESHOLD * total:
            checks.append(
                Check(
                    name,
                    "warn",
                    _over_message(g, total, used, n),
                    "time-slicing does not isolate memory: fewer replicas, MPS "
                    "(sharing.mps caps each client's memory) or MIG",
                )
            )
        else:
            checks.append(
                Check(
                    name,
                    "pass",
                    f"{100 * used / total:.0f} % used, {n} {sharing.strategy} replicas",
                )
            )
    return checks
