"""Per-process usage of a device, as a backend reports it (the ``usage`` hook).

The framework maps each process to the container that runs it (the host's
``/proc/<pid>/cgroup``, the kubelet's device checkpoint and its pod-resources API)
and exports the sums per container (docs/operations.md, "Attribution").
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessUsage:
    """What one process uses of one device, any figure unknown.

    device
        The backend's own device ID, as its ``Device.id`` says: the physical device,
        or the carved-out one (a MIG device) the process runs on; never a replica's
        ID (``<id>::<n>``): the framework finds the replica the process's container
        holds.
    pid
        The process ID as the host sees it (the driver's PIDs are the host's).
    memory_bytes
        Device memory the process holds; ``None``: unknown (the driver does not say).
    utilization
        The share of the device's compute the process used lately, 0 to 1 (NVML's
        per-process SM utilisation / 100); ``None``: unknown.
    """

    device: str
    pid: int
    memory_bytes: int | None = None
    utilization: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"ProcessUsage.device must be a device ID, got {self.device!r}")
        if isinstance(self.pid, bool) or not isinstance(self.pid, int) or self.pid <= 0:
            raise ValueError(f"ProcessUsage.pid must be a positive int, got {self.pid!r}")
        m = self.memory_bytes
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
            raise ValueError(f"ProcessUsage.memory_bytes must be an int >= 0 or None, got {m!r}")
        u = self.utilization
        if u is not None and (
            isinstance(u, bool)
            or not isinstance(u, int | float)
            or not math.isfinite(u)
            or not 0 <= u <= 1
        ):
            raise ValueError(f"ProcessUsage.utilization must be 0 to 1 or None, got {u!r}")
