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
from typing import Any, Literal

from hetero_dp import ConfigError, Device, is_replica, option, replica_base
from hetero_dp import parse_options as read_options

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


def _size_mib(value: Any, where: str, source: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value  # a bare number is MiB, as the control daemon's "M" unit
    match = _SIZE.match(str(value).strip())
    if not match or isinstance(value, bool):
        raise ConfigError(
            f"expected a size such as 4096M, 8G or 8Gi, got {value!r}", field=where, source=source
        )
    mib = int(match.group(1)) * _UNITS[match.group(2).upper()] // MIB
    if mib <= 0:
        raise ConfigError(f"must be at least 1M, got {value!r}", field=where, source=source)
    return mib


@dataclass(frozen=True)
class MpsLimitOptions:
    """``mps.resources.<name>``: the limits of one shared resource's clients."""

    pinned_device_memory_limit: int | str | None = option(
        None, help="pinned device memory per client and GPU: 4096M, 8G, 8Gi (a number: MiB)"
    )
    active_thread_percentage: int | None = option(
        None, min=1, max=100, help="the share of each GPU's threads a client may use"
    )


@dataclass(frozen=True)
class MpsOptions:
    """``mps``: the control daemons (docs/sharing.md), read by the options reader: an
    unknown key gets the closest known one, a value its field and reason."""

    visible_root: str = option("", help="where this process sees the MPS root")
    control_daemon: Literal["managed", "external"] = option(
        "managed", help="managed: the plugin runs the daemons; external: another container"
    )
    control_path: str = option("", help="nvidia-cuda-mps-control ('': the driver's, then PATH)")
    check_interval: float = option(10.0, min=0.001, help="seconds between health checks")
    command_timeout: float = option(10.0, min=0.001, help="seconds a control command may take")
    backoff: float = option(1.0, min=0.001, help="seconds before the first restart")
    max_backoff: float = option(60.0, min=0.001, help="the longest wait between restarts")
    resources: dict[str, MpsLimitOptions] = option({}, help="limits per shared resource")


def parse_mps_settings(value: Any, root: str, source: str = "config") -> MpsSettings:
    """Parse ``backends.nvidia.mps``; ConfigError names the field (a key set to null is
    left at its default, as an unset chart value renders)."""
    raw = {} if value is None else value
    if isinstance(raw, Mapping):
        raw = {k: v for k, v in raw.items() if v is not None}
    read = read_options(MpsOptions, raw, field="mps", source=source, environ={})
    limits: dict[str, Limits] = {}
    for name, item in read.resources.items():
        at = f"mps.resources.{name}.pinnedDeviceMemoryLimit"
        mem = item.pinned_device_memory_limit
        limits[name] = Limits(
            _size_mib(mem, at, source) if mem is not None else None,
            item.active_thread_percentage,
        )
    return MpsSettings(
        root=root or DEFAULT_ROOT,
        visible_root=read.visible_root,
        control=read.control_daemon,
        control_path=read.control_path,
        check_interval_s=read.check_interval,
        command_timeout_s=read.command_timeout,
        backoff_s=read.backoff,
        max_backoff_s=read.max_backoff,
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
