"""MPS sharing: the control daemon per shared resource, its limits, its health.

Facts from NVIDIA's k8s-device-plugin (cmd/mps-control-daemon/mps/daemon.go,
root.go, internal/plugin/mps.go), read, not copied:

- One control daemon per shared *resource name*, with its pipe and log
  directories under the MPS root: ``<root>/<resource>/pipe``, ``<root>/<resource>/log``;
  a ``<root>/<resource>/.started`` file once its limits are set; the shared memory
  the daemon and its clients use is ``<root>/shm`` (mounted at ``/dev/shm``).
- It is started with ``nvidia-cuda-mps-control -d`` and env
  ``CUDA_MPS_PIPE_DIRECTORY``/``CUDA_MPS_LOG_DIRECTORY``; commands go to it by
  running ``nvidia-cuda-mps-control`` with the command on stdin.
- Limits: ``set_default_device_pinned_mem_limit <index> <MiB>M`` per GPU (the GPU's
  memory / replicas) and ``set_default_active_thread_percentage <100/replicas>``.
- Health: ``get_default_active_thread_percentage`` answers; stop: ``quit``.
- A container gets ``CUDA_MPS_PIPE_DIRECTORY=/mps/<resource>/pipe`` and mounts
  of the host's pipe dir there and of ``<root>/shm`` at ``/dev/shm``.
- At most 48 clients per GPU from Volta on, 16 before (device.go): more replicas
  are refused.

Ours on top: the plugin runs and supervises the daemons itself (``managed``),
restarting a dead one with exponential backoff; every GPU of a resource whose
daemon is down or does not answer is Unhealthy with the reason, so all its
replicas leave allocatable at once. ``external`` leaves the daemon to another
container (NVIDIA's mps-control-daemon DaemonSet) and only checks that it answers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero_dp import ConfigError, Device, is_replica, replica_base

CONTROL_BIN = "nvidia-cuda-mps-control"
CONTAINER_ROOT = "/mps"  # where a client container sees the MPS root (NVIDIA's ContainerRoot)
DEFAULT_ROOT = "/run/nvidia/mps"  # NVIDIA's chart value mps.root
MIB = 1024 * 1024
MODES = ("managed", "external")
_SIZE = re.compile(r"^(\d+)\s*([KMGT]?)(i?B?)?$", re.IGNORECASE)
_UNITS = {"": MIB, "K": 1024, "M": MIB, "G": 1024 * MIB, "T": 1024 * 1024 * MIB}


@dataclass(frozen=True)
class Limits:
    """Per-resource overrides: pinned device memory per client and active threads."""

    pinned_memory_mib: int | None = None
    active_thread_percentage: int | None = None


@dataclass(frozen=True)
class MpsSettings:
    """``backends.nvidia.mps`` (ours) plus NVIDIA's ``flags.mpsRoot``."""

    root: str = DEFAULT_ROOT  # on the host: what client containers mount
    visible_root: str = ""  # where this process sees the root (see local_root)
    control: str = "managed"
    control_path: str = ""  # "" = <driver root>/usr/bin, then PATH
    check_interval_s: float = 10.0
    command_timeout_s: float = 10.0
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    limits: Mapping[str, Limits] = field(default_factory=dict)

    @property
    def local_root(self) -> str:
        """Where this process sees the root: ``visibleRoot``, else NVIDIA's container
        path ``/mps`` when it exists (the chart mounts the root there), else the root."""
        if self.visible_root:
            return self.visible_root
        return CONTAINER_ROOT if os.path.isdir(CONTAINER_ROOT) else self.root


def _size_mib(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value  # a bare number is MiB, as the control daemon's "M" unit
    match = _SIZE.match(str(value).strip())
    if not match or isinstance(value, bool):
        raise ConfigError(
            f"expected a size such as 4096M, 8G or 8Gi, got {value!r}", field=where, source="config"
        )
    mib = int(match.group(1)) * _UNITS[match.group(2).upper()] // MIB
    if mib <= 0:
        raise ConfigError(f"must be at least 1M, got {value!r}", field=where, source="config")
    return mib


def parse_mps_settings(value: Any, root: str) -> MpsSettings:
    """Parse ``backends.nvidia.mps``; ConfigError names the field."""
    where = "mps"
    raw = value or {}
    if not isinstance(raw, Mapping):
        raise ConfigError("expected a mapping", field=where, source="config")
    known = {
        "visibleRoot": str,
        "controlDaemon": str,
        "controlPath": str,
        "checkInterval": float,
        "commandTimeout": float,
        "backoff": float,
        "maxBackoff": float,
        "resources": dict,
    }
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown key (known: {', '.join(sorted(known))})",
            field=f"{where}.{unknown[0]}",
            source="config",
        )
    control = str(raw.get("controlDaemon", "managed"))
    if control not in MODES:
        raise ConfigError(
            f"must be one of {', '.join(MODES)}, got {control!r}",
            field=f"{where}.controlDaemon",
            source="config",
        )
    numbers: dict[str, float] = {}
    for key, default in (
        ("checkInterval", 10.0),
        ("commandTimeout", 10.0),
        ("backoff", 1.0),
        ("maxBackoff", 60.0),
    ):
        v = raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
            raise ConfigError(
                f"expected a positive number of seconds, got {v!r}",
                field=f"{where}.{key}",
                source="config",
            )
        numbers[key] = float(v)
    limits: dict[str, Limits] = {}
    resources = raw.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ConfigError("expected a mapping", field=f"{where}.resources", source="config")
    for name, item in resources.items():
        at = f"{where}.resources.{name}"
        if not isinstance(item, Mapping):
            raise ConfigError("expected a mapping", field=at, source="config")
        extra = sorted(set(item) - {"pinnedDeviceMemoryLimit", "activeThreadPercentage"})
        if extra:
            raise ConfigError(
                "unknown key (known: activeThreadPercentage, pinnedDeviceMemoryLimit)",
                field=f"{at}.{extra[0]}",
                source="config",
            )
        mem = item.get("pinnedDeviceMemoryLimit")
        pct = item.get("activeThreadPercentage")
        if pct is not None and (
            isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100
        ):
            raise ConfigError(
                f"expected a whole percentage from 1 to 100, got {pct!r}",
                field=f"{at}.activeThreadPercentage",
                source="config",
            )
        limits[str(name)] = Limits(
            _size_mib(mem, f"{at}.pinnedDeviceMemoryLimit") if mem is not None else None, pct
        )
    return MpsSettings(
        root=root or DEFAULT_ROOT,
        visible_root=str(raw.get("visibleRoot") or ""),
        control=control,
        control_path=str(raw.get("controlPath") or ""),
        check_interval_s=numbers["checkInterval"],
        command_timeout_s=numbers["commandTimeout"],
        backoff_s=numbers["backoff"],
        max_backoff_s=numbers["maxBackoff"],
        limits=limits,
    )


# --- the plan: which resources run a daemon, with which limits ---------------------------


@dataclass(frozen=True)
class MpsGpu:
    uuid: str
    index: int
    memory_mib: int
    compute_major: int = 0


@dataclass(frozen=True)
class MpsResource:
    """One shared resource name and the GPUs behind its replicas."""

    name: str
    replicas: int
    gpus: tuple[MpsGpu, ...]
    limits: Limits = field(default_factory=Limits)

    def pinned_limits_mib(self) -> dict[int, int]:
        """GPU index -> pinned memory limit per client, in MiB (memory / replicas)."""
        out = {}
        for g in self.gpus:
            limit = self.limits.pinned_memory_mib or g.memory_mib // self.replicas
            if limit > 0:  # NVIDIA skips GPUs whose memory is unknown
                out[g.index] = limit
        return out

    def active_thread_percentage(self) -> int:
        return self.limits.active_thread_percentage or max(1, 100 // self.replicas)

    def commands(self) -> list[str]:
        """What the daemon is told after it starts, in order."""
        cmds = [
            f"set_default_device_pinned_mem_limit {index} {mib}M"
            for index, mib in sorted(self.pinned_limits_mib().items())
        ]
        cmds.append(f"set_default_active_thread_percentage {self.active_thread_percentage()}")
        return cmds


def max_clients(compute_major: int) -> int:
    """MPS clients per GPU: 48 from Volta (compute 7.x) on, 16 before (NVIDIA's device.go)."""
    return 48 if compute_major >= 7 else 16


def plan_mps(advertised: Sequence[Device], settings: MpsSettings) -> list[MpsResource]:
    """The daemons the advertised replicas need: one per resource that holds replicas."""
    groups: dict[str, dict[str, list[Device]]] = {}
    for d in advertised:
        if is_replica(d.id):
            groups.setdefault(d.resource, {}).setdefault(replica_base(d.id), []).append(d)
    out = []
    for name, by_gpu in groups.items():
        gpus = []
        for uuid, replicas in by_gpu.items():
            attrs = replicas[0].attributes
            cc = str(attrs.get("cudaComputeCapability", "0.0"))
            gpus.append(
                MpsGpu(
                    uuid=str(attrs.get("uuid", uuid)),
                    index=int(replicas[0].index if replicas[0].index is not None else -1),
                    memory_mib=int(attrs.get("memoryMiB", 0) or 0),
                    compute_major=int(cc.partition(".")[0] or 0),
                )
            )
        n = max(len(r) for r in by_gpu.values())
        for g in gpus:
            if n > max_clients(g.compute_major):
                raise ConfigError(
                    f"{n} MPS replicas of GPU {g.index} ({g.uuid}) exceed the "
                    f"{max_clients(g.compute_major)} clients MPS serves per GPU of compute "
                    f"capability {g.compute_major}.x",
                    field="sharing.mps.resources",
                    source="config",
                )
        limits = settings.limits.get(name) or settings.limits.get(name.partition("/")[2], Limits())
        out.append(MpsResource(name, n, tuple(sorted(gpus, key=lambda g: g.index)), limits))
    return sorted(out, key=lambda r: r.name)


def mps_response(resource: MpsResource, settings: MpsSettings) -> tuple[dict[str, str], list]:
    """What a container of ``resource`` gets: env and (host, container) mounts."""
    pipe = os.path.join(CONTAINER_ROOT, resource.name, "pipe")
    mounts = [
        (os.path.join(settings.root, resource.name, "pipe"), pipe),
        (os.path.join(settings.root, "shm"), "/dev/shm"),
    ]
    return {"CUDA_MPS_PIPE_DIRECTORY": pipe}, mounts
