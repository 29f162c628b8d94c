"""Per-process usage of the GPUs and MIG devices, from NVML (the ``usage`` hook).

- Memory: ``nvmlDeviceGetComputeRunningProcesses`` and, for MPS clients,
  ``nvmlDeviceGetMPSComputeRunningProcesses`` (NVML API reference: the MPS call lists
  the processes "with a MPS compute context"). ``usedGpuMemory`` may be "not
  available" (all ones; pynvml gives ``None``): it stays unknown.
- MIG: asked on the parent GPU, NVML "returns aggregate information" with each
  process's GPU and compute instance IDs (nvml.h, nvmlProcessInfo_t); the pair names
  the MIG device the backend advertises. Where the parent refuses (a caller without
  the privileges nvml.h says that needs), each MIG device's handle is asked instead.
- Utilization: ``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)`` gives
  one sample per process "that had some non-zero utilization during the last sample
  period", newer than the timestamp (nvml.h); the last timestamp is kept per GPU, so
  each call sees what is new. SM utilization / 100 is the share, 0-1. A process
  without a sample among others that have one was idle (0). Two reads close together
  (a Prometheus scrape and ``hetero-dp top``) would find nothing new the second time
  (NOT_FOUND), so the last shares are held for :data:`HOLD_S`; past that, no samples,
  MIG (NOT_SUPPORTED) or an older driver: unknown.

The framework maps PIDs to containers; this module knows no pods.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pynvml

from hetero_dp import ProcessUsage, replica_base

from . import nvml
from .discovery import NO_INSTANCE, GpuInfo, NodeInfo
from .nvml import NVMLError, explain, log_once

HOLD_S = 10.0  # how long a GPU's last shares answer reads that find no new sample

# pynvml raises this (no NVMLError) for a symbol the driver lacks: an older driver
MISSING = (pynvml.NVMLLibraryMismatchError, AttributeError)


@dataclass
class Proc:
    pid: int
    memory: int | None  # bytes; None: NVML cannot tell
    gi: int = NO_INSTANCE
    ci: int = NO_INSTANCE


def running_processes(handle: Any) -> list[Proc]:
    """Compute and MPS client processes on a device; raises NVMLError as NVML does (an
    older driver without one of the calls: that list is empty)."""
    out: dict[int, Proc] = {}
    for call in (
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        pynvml.nvmlDeviceGetMPSComputeRunningProcesses,
    ):
        try:
            procs = call(handle)
        except MISSING:
            continue
        for p in procs:
            used = p.usedGpuMemory
            proc = Proc(
                int(p.pid),
                None if used is None else int(used),
                int(getattr(p, "gpuInstanceId", NO_INSTANCE)),
                int(getattr(p, "computeInstanceId", NO_INSTANCE)),
            )
            seen = out.get(proc.pid)
            if seen is None or (seen.memory is None and proc.memory is not None):
                out[proc.pid] = proc
    return list(out.values())


class UsageReader:
    """Reads usage for the ``usage`` hook, remembering each GPU's last sample time."""

    def __init__(self, hold_s: float = HOLD_S) -> None:
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._last_seen: dict[str, int] = {}  # GPU UUID -> newest sample timestamp (µs)
        # GPU UUID -> (monotonic time read, PID -> share): answers reads with nothing new
        self._held: dict[str, tuple[float, dict[int, float]]] = {}

    def read(self, node: NodeInfo, wanted: Iterable[str]) -> list[ProcessUsage]:
        ids = {replica_base(i) for i in wanted}
        out: list[ProcessUsage] = []
        for g in node.gpus:
            if g.handle is None or not g.uuid or g.error:
                continue
            if g.uuid not in ids and not any(m.uuid in ids for m in g.migs):
                continue
            out += self._gpu(g, ids)
        return out

    def _gpu(self, g: GpuInfo, ids: set[str]) -> list[ProcessUsage]:
        placed = self._placed(g, ids)
        if not placed:
            return []
        util = None if g.mig_enabled else self._utilization(g)
        return [
            ProcessUsage(
                device,
                p.pid,
                p.memory,
                None if util is None else util.get(p.pid, 0.0),
            )
            for device, p in placed
        ]

    def _placed(self, g: GpuInfo, ids: set[str]) -> list[tuple[str, Proc]]:
        """(device ID, process): each process on the device it runs on, as advertised."""
        try:
            procs = running_processes(g.handle)
        except NVMLError as err:
            if not (g.mig_enabled and g.migs):
                _log(err, "the running processes", g.uuid)
                return []
            return self._per_mig(g, ids, err)
        by_instance = {(m.gi, m.ci): m.uuid for m in g.migs}
        out = []
        for p in procs:
            device = by_instance.get((p.gi, p.ci)) if g.mig_enabled else None
            if device not in ids:  # not on a MIG device served as one: the GPU's
                device = g.uuid if g.uuid in ids else None
            if device is not None:
                out.append((device, p))
        return out

    def _per_mig(self, g: GpuInfo, ids: set[str], parent_err: Any) -> list[tuple[str, Proc]]:
        log_once(
            f"usage:{g.uuid}:{parent_err.value}",
            f"{explain(parent_err, 'the running processes', g.uuid)}; asking its MIG "
            "devices one by one",
            logging.INFO,
        )
        out = []
        for m in g.migs:
            if m.handle is None or m.uuid not in ids:
                continue
            try:
                out += [(m.uuid, p) for p in running_processes(m.handle)]
            except NVMLError as err:
                _log(err, "the running processes", m.uuid)
        return out

    def _utilization(self, g: GpuInfo) -> dict[int, float] | None:
        """PID -> share of the GPU's SMs lately; None: unknown."""
        with self._lock:
            since = self._last_seen.get(g.uuid, 0)
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(g.handle, since)
        except MISSING:
            return None
        except NVMLError as err:
            if err.value == nvml.NOT_FOUND:
                return self._still_held(g.uuid)
            if err.value != nvml.NOT_SUPPORTED:
                _log(err, "the process utilization", g.uuid)
            return None
        newest: dict[int, Any] = {}
        for s in samples:
            pid = int(s.pid)
            if pid not in newest or s.timeStamp > newest[pid].timeStamp:
                newest[pid] = s
        if not newest:
            return self._still_held(g.uuid)
        shares = {pid: min(max(int(s.smUtil), 0), 100) / 100 for pid, s in newest.items()}
        with self._lock:
            top = max(int(s.timeStamp) for s in newest.values())
            self._last_seen[g.uuid] = max(top, self._last_seen.get(g.uuid, 0))
            self._held[g.uuid] = (time.monotonic(), shares)
        return shares

    def _still_held(self, uuid: str) -> dict[int, float] | None:
        with self._lock:
            held = self._held.get(uuid)
        if held is None or time.monotonic() - held[0] > self.hold_s:
            return None
        return held[1]


def _log(err: Any, what: str, uuid: str) -> None:
    level = logging.DEBUG if err.value == nvml.NOT_SUPPORTED else logging.WARNING
    log_once(f"usage:{what}:{uuid}:{err.value}", explain(err, what, uuid), level)
