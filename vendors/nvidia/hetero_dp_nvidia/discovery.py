"""Read GPUs and MIG devices from NVML, then turn them into hetero-dp Device records.

Reading (:func:`read_node`) and record building (:func:`build_devices`) are
separate so that records can be rebuilt for another strategy without NVML.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import pynvml

from hetero_dp import ConfigError, Device, DeviceNode, Mount

from . import nvml
from .nvml import NVMLError, explain, log_once, text
from .options import Options

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
GPU_RESOURCE = "nvidia.com/gpu"
NO_INSTANCE = 0xFFFFFFFF

# compute capability major -> GPU feature discovery family name
FAMILIES = {
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    7: "volta",
    8: "ampere",
    9: "hopper",
    10: "blackwell",
    12: "blackwell",
}


@dataclass
class MigInfo:
    index: int  # within the parent GPU, as NVML enumerates it
    uuid: str
    gi: int
    ci: int
    gi_slices: int
    ci_slices: int
    memory_mib: int
    profile: str
    handle: Any = field(repr=False, compare=False, default=None)


@dataclass
class GpuInfo:
    index: int
    uuid: str
    name: str = ""
    minor: int = -1
    memory_mib: int = 0
    cc: tuple[int, int] = (0, 0)
    pci_bus_id: str = ""  # normalised, sysfs form
    numa: int = -1
    mig_capable: bool = False
    mig_enabled: bool = False
    migs: list[MigInfo] = field(default_factory=list)
    error: str = ""  # set when the GPU answered with an error (lost ...)
    handle: Any = field(repr=False, compare=False, default=None)

    @property
    def family(self) -> str:
        return FAMILIES.get(self.cc[0], "undefined")


@dataclass
class NodeInfo:
    driver_version: str = ""
    cuda_version: int = 0  # 12040 -> CUDA 12.4
    gpus: list[GpuInfo] = field(default_factory=list)

    @property
    def cuda_major_minor(self) -> tuple[int, int]:
        return self.cuda_version // 1000, (self.cuda_version % 1000) // 10

    def gpu(self, uuid: str) -> GpuInfo | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


def mig_profile(gi_slices: int, ci_slices: int, memory_mib: int) -> str:
    """NVIDIA's profile name: ``1g.5gb``, or ``2c.4g.40gb`` for a compute-instance slice."""
    gb = math.ceil(memory_mib / 1024)
    name = f"{gi_slices}g.{gb}gb"
    if ci_slices and ci_slices != gi_slices:
        name = f"{ci_slices}c.{name}"
    return name


# NVML's GPU instance profile enum (nvml.h NVML_GPU_INSTANCE_PROFILE_*) -> the profile
# name's attribute suffix, as NVIDIA's go-nvlib names profiles (mig_profile.go):
# REV1 = media extensions "+me", ALL_ME "+me.all", GFX "+gfx", NO_ME "-me".
PROFILE_SUFFIX = {
    7: "+me",  # 1 slice REV1
    8: "+me",  # 2 slice REV1
    10: "+gfx",
    11: "+gfx",
    12: "+gfx",
    13: "-me",
    14: "-me",
    15: "+me.all",
    16: "+me.all",
}
GPU_INSTANCE_PROFILE_COUNT = 18
# GPU UUID -> (profile enum, profile info) of each GPU instance profile it has; fixed
# per GPU model, so read once (naming MIG devices and dynamic MIG both use it)
_gi_profiles: dict[str, list[tuple[int, Any]]] = {}


def _gi_profile_info(handle: Any, enum: int) -> Any:
    try:
        return pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=1)
    except TypeError:  # an older nvidia-ml-py without the version argument
        return pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)


def gi_profiles(gpu: GpuInfo) -> list[tuple[int, Any]]:
    """(NVML profile enum, profile info) of every GPU instance profile ``gpu`` has."""
    table = _gi_profiles.get(gpu.uuid)
    if table is None:
        table = []
        for enum in range(GPU_INSTANCE_PROFILE_COUNT):
            try:
                table.append((enum, _gi_profile_info(gpu.handle, enum)))
            except NVMLError as err:
                if err.value in (nvml.NOT_SUPPORTED, nvml.INVALID_ARGUMENT):
                    continue  # a profile this GPU does not have
                raise
        _gi_profiles[gpu.uuid] = table
    return table


def _enums(gpu: GpuInfo) -> dict[int, int]:
    """{profile ID the driver reports: NVML profile enum}."""
    return {int(info.id): enum for enum, info in gi_profiles(gpu)}


def profile_suffix(gpu: GpuInfo, gi: int) -> str:
    """``+me`` and the like for the GPU instance ``gi`` of ``gpu`` ("" for a plain one).

    As NVIDIA's plugin finds it: the instance's profile ID, matched against the
    GPU's profile table to get NVML's profile enum, whose revision names the
    attribute. Any NVML error leaves the plain name (logged once).
    """
    try:
        info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(gpu.handle, gi))
        enum = _enums(gpu).get(int(info.profileId))
    except NVMLError as err:
        log_once(
            f"gi-profile:{gpu.uuid}:{err.value}",
            explain(err, "reading the MIG GPU instance profile", gpu.uuid)
            + "; MIG profiles are named without attributes such as +me",
            logging.INFO
            if err.value in (nvml.NOT_SUPPORTED, nvml.FUNCTION_NOT_FOUND)
            else logging.WARNING,
        )
        return ""
    return PROFILE_SUFFIX.get(enum, "") if enum is not None else ""


def mig_resource(profile: str) -> str:
    return "nvidia.com/mig-" + profile.replace("+", ".")


def read_numa(sysfs_root: str, bus_id: str) -> int:
    path = os.path.join(sysfs_root, "bus/pci/devices", bus_id, "numa_node")
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return -1


def _optional(call: Any, *args: Any, what: str, device: str, default: Any) -> Any:
    """Call an NVML function whose absence or NOT_SUPPORTED is survivable."""
    try:
        return call(*args)
    except NVMLError as err:
        if err.value in (nvml.NOT_SUPPORTED, nvml.FUNCTION_NOT_FOUND):
            # NOT_SUPPORTED is normal (MIG on a GPU without MIG); a missing function is not.
            level = logging.INFO if err.value == nvml.NOT_SUPPORTED else logging.WARNING
            log_once(f"{what}:{err.value}:{device[:4]}", explain(err, what, device), level)
            return default
        raise


def read_node(opts: Options) -> NodeInfo:
    """Everything discovery needs from NVML (initialised by the caller)."""
    node = NodeInfo()
    node.driver_version = text(pynvml.nvmlSystemGetDriverVersion())
    node.cuda_version = _optional(
        pynvml.nvmlSystemGetCudaDriverVersion, what="CUDA driver version", device="", default=0
    )
    for i in range(pynvml.nvmlDeviceGetCount()):
        node.gpus.append(_read_gpu(i, opts))
    return node


def _read_gpu(index: int, opts: Options) -> GpuInfo:
    gpu = GpuInfo(index=index, uuid="")
    try:
        h = gpu.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        gpu.uuid = text(pynvml.nvmlDeviceGetUUID(h))
    except NVMLError as err:
        # Without a UUID the GPU cannot be advertised; say so once and which index.
        gpu.error = explain(err, "reading the UUID", f"GPU index {index}")
        log_once(f"gpu-uuid:{index}", gpu.error)
        return gpu
    try:
        gpu.name = text(pynvml.nvmlDeviceGetName(h))
        gpu.minor = pynvml.nvmlDeviceGetMinorNumber(h)
        gpu.memory_mib = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
        gpu.cc = tuple(
            _optional(
                pynvml.nvmlDeviceGetCudaComputeCapability,
                h,
                what="compute capability",
                device=gpu.uuid,
                default=(0, 0),
            )
        )
        gpu.pci_bus_id = nvml.normalise_bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId)
        gpu.numa = read_numa(opts.sysfs_root, gpu.pci_bus_id)
        mode = _optional(
            pynvml.nvmlDeviceGetMigMode, h, what="MIG mode", device=gpu.uuid, default=None
        )
        gpu.mig_capable = mode is not None
        gpu.mig_enabled = bool(mode and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
        if gpu.mig_enabled and opts.mig_strategy != "none":
            gpu.migs = read_migs(gpu)
    except NVMLError as err:
        gpu.error = explain(err, "reading GPU properties", gpu.uuid)
        log_once(f"gpu:{gpu.uuid}:{err.value}", gpu.error)
    return gpu


def read_migs(gpu: GpuInfo) -> list[MigInfo]:
    migs: list[MigInfo] = []
    count = pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)
    for j in range(count):
        try:
            mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, j)
        except NVMLError as err:
            if err.value == nvml.NOT_FOUND:
                continue  # an empty slot in the MIG layout
            raise
        uuid = text(pynvml.nvmlDeviceGetUUID(mh))
        try:
            attrs = pynvml.nvmlDeviceGetAttributes(mh)
            gi = pynvml.nvmlDeviceGetGpuInstanceId(mh)
            ci = pynvml.nvmlDeviceGetComputeInstanceId(mh)
        except NVMLError as err:
            if err.value in (nvml.NOT_SUPPORTED, nvml.FUNCTION_NOT_FOUND):
                # Without its profile a MIG device cannot be named; skip it, loudly.
                log_once(
                    f"mig:{uuid}:{err.value}",
                    explain(err, "reading MIG attributes", uuid)
                    + f"; MIG device {uuid} of GPU {gpu.uuid} is not advertised "
                    f"(fix: {nvml.FIX_OLD_DRIVER})",
                )
                continue
            raise
        migs.append(
            MigInfo(
                index=j,
                uuid=uuid,
                gi=gi,
                ci=ci,
                gi_slices=attrs.gpuInstanceSliceCount,
                ci_slices=attrs.computeInstanceSliceCount,
                memory_mib=int(attrs.memorySizeMB),
                profile=mig_profile(
                    attrs.gpuInstanceSliceCount,
                    attrs.computeInstanceSliceCount,
                    int(attrs.memorySizeMB),
                )
                + profile_suffix(gpu, gi),
                handle=mh,
            )
        )
    return migs


def check_layout(node: NodeInfo, strategy: str) -> None:
    """Raise ConfigError when the MIG layout does not fit the strategy (NVIDIA's rules)."""
    if strategy != "single":
        return
    usable = [g for g in node.gpus if g.uuid and not g.error]
    enabled = [g for g in usable if g.mig_enabled]
    if not enabled:
        return  # no MIG anywhere: single behaves as none
    fix = "enable MIG with one profile on every GPU, or set migStrategy to mixed"
    disabled = [g for g in usable if not g.mig_enabled]
    if disabled:
        raise ConfigError(
            "MIG strategy single needs every GPU in the same MIG mode, but GPUs "
            f"{_ids(enabled)} are in MIG mode and GPUs {_ids(disabled)} are not; fix: {fix}",
            field="migStrategy",
        )
    empty = [g for g in enabled if not g.migs]
    if empty:
        raise ConfigError(
            f"MIG strategy single: GPUs {_ids(empty)} are in MIG mode but have no MIG "
            f"devices; fix: create MIG devices (nvidia-smi mig -cgi ... -C) or {fix}",
            field="migStrategy",
        )
    profiles: dict[str, list[str]] = {}
    for g in enabled:
        for m in g.migs:
            profiles.setdefault(m.profile, []).append(f"{g.index}:{m.index}")
    if len(profiles) > 1:
        found = "; ".join(f"{p} on {', '.join(ids)}" for p, ids in sorted(profiles.items()))
        raise ConfigError(
            f"MIG strategy single needs one MIG profile on the node, found {found}; fix: {fix}",
            field="migStrategy",
        )


def _ids(gpus: list[GpuInfo]) -> str:
    return ", ".join(str(g.index) for g in gpus)


_CAP_MINOR = re.compile(r"DeviceFileMinor:\s*(\d+)")
# The driver fixes each capability file's minor for (GPU minor, GI, CI): cache the reads,
# which otherwise dominate discovery on a node full of MIG devices.
_cap_minors: dict[str, str] = {}


def _cap_node(opts: Options, gpu: GpuInfo, sub: str) -> DeviceNode | None:
    path = os.path.join(
        opts.proc_root, "driver/nvidia/capabilities", f"gpu{gpu.minor}", "mig", sub, "access"
    )
    minor = _cap_minors.get(path)
    if minor is None:
        try:
            with open(path) as f:
                m = _CAP_MINOR.search(f.read())
        except OSError:
            m = None
        if m:
            minor = _cap_minors[path] = m.group(1)
    if minor is None:
        log_once(
            f"cap:{path}",
            f"MIG capability file {path} is missing or unreadable; the MIG device node "
            "cannot be passed; fix: mount the host's /proc/driver/nvidia (procRoot) "
            "or set plugin.passDeviceSpecs to false",
        )
        return None
    name = f"/dev/nvidia-caps/nvidia-cap{minor}"
    return DeviceNode(_host(opts, name), name)


def _host(opts: Options, path: str) -> str:
    return os.path.join(opts.host_dev_root, path.lstrip("/"))


def control_nodes(opts: Options) -> tuple[DeviceNode, ...]:
    """nvidiactl, nvidia-uvm ... where present under the (visible) dev root."""
    nodes = []
    for name in CONTROL_NODES:
        if os.path.exists(os.path.join(opts.visible_dev_root, "dev", name)):
            nodes.append(DeviceNode(_host(opts, f"/dev/{name}"), f"/dev/{name}", shared=True))
    return tuple(nodes)


def _delivery(opts: Options, visible_id: str) -> tuple[dict[str, str], tuple[Mount, ...]]:
    strategies = opts.device_list_strategy
    extra = opts.extra_env  # NVIDIA_GDRCOPY/GDS/MOFED=enabled, under every strategy
    if "volume-mounts" in strategies:
        mount = Mount("/dev/null", f"{VOLUME_MOUNT_ROOT}/{visible_id}", read_only=False)
        return {VISIBLE_DEVICES: VOLUME_MOUNT_ROOT, **extra}, (mount,)
    if "envvar" in strategies:
        return {VISIBLE_DEVICES: visible_id, **extra}, ()
    return extra, ()  # CDI only: no NVIDIA_VISIBLE_DEVICES, no mounts (as NVIDIA's)


def _wants_nodes(opts: Options) -> bool:
    # A CDI spec always needs the nodes (even beside envvar); DeviceSpecs go into the
    # Allocate response only with passDeviceSpecs (the backend's allocate hook drops
    # them otherwise, as NVIDIA's plugin sends none).
    return opts.pass_device_specs or opts.uses_cdi or not opts.uses_env


def build_devices(node: NodeInfo, opts: Options) -> list[Device]:
    """Device records for the node under the options' MIG, ID and list strategies."""
    check_layout(node, opts.mig_strategy)
    shared = control_nodes(opts) if _wants_nodes(opts) else ()
    mig_mode = opts.mig_strategy
    if mig_mode == "single" and not any(g.mig_enabled for g in node.gpus):
        mig_mode = "none"
    devices: list[Device] = []
    for gpu in node.gpus:
        if not gpu.uuid:
            continue
        if mig_mode != "none" and gpu.mig_enabled and not gpu.error:
            devices.extend(_mig_devices(node, gpu, opts, shared, mig_mode))
        else:
            devices.append(_gpu_device(node, gpu, opts, shared))
    return devices


def _common_attributes(node: NodeInfo, gpu: GpuInfo) -> dict[str, Any]:
    cuda = node.cuda_major_minor
    return {
        "productName": gpu.name,
        "architecture": gpu.family,
        "cudaComputeCapability": f"{gpu.cc[0]}.{gpu.cc[1]}",
        "pcieBusID": gpu.pci_bus_id,
        "driverVersion": node.driver_version,
        "cudaDriverVersion": f"{cuda[0]}.{cuda[1]}",
    }


def _gpu_device(
    node: NodeInfo, gpu: GpuInfo, opts: Options, shared: tuple[DeviceNode, ...]
) -> Device:
    visible = gpu.uuid if opts.device_id_strategy == "uuid" else str(gpu.index)
    env, mounts = _delivery(opts, visible)
    nodes: tuple[DeviceNode, ...] = ()
    if _wants_nodes(opts) and gpu.minor >= 0:
        nodes = (
            *shared,
            DeviceNode(_host(opts, f"/dev/nvidia{gpu.minor}"), f"/dev/nvidia{gpu.minor}"),
        )
    attrs = _common_attributes(node, gpu)
    attrs.update(uuid=gpu.uuid, index=gpu.index, minor=gpu.minor, memoryMiB=gpu.memory_mib)
    attrs["migEnabled"] = gpu.mig_enabled
    return Device(
        id=gpu.uuid,
        resource=opts.renames.gpu(gpu.name, GPU_RESOURCE),
        healthy=not gpu.error,
        reason=gpu.error,
        numa_nodes=gpu.numa,  # type: ignore[arg-type]  # an int < 0 means none
        nodes=nodes,
        mounts=mounts,
        env=env,
        index=gpu.index,
        attributes=attrs,
    )


def _mig_devices(
    node: NodeInfo,
    gpu: GpuInfo,
    opts: Options,
    shared: tuple[DeviceNode, ...],
    mig_mode: str,
) -> list[Device]:
    out = []
    for mig in gpu.migs:
        resource = opts.renames.mig_device(
            mig.profile, GPU_RESOURCE if mig_mode == "single" else mig_resource(mig.profile)
        )
        out.append(mig_record(node, gpu, mig, opts, resource, shared))
    return out


def mig_record(
    node: NodeInfo,
    gpu: GpuInfo,
    mig: MigInfo,
    opts: Options,
    resource: str,
    shared: tuple[DeviceNode, ...] | None = None,
) -> Device:
    """The record of one MIG device: its nodes (the GPU's and the two capability
    nodes), env, mounts and attributes."""
    if shared is None:
        shared = control_nodes(opts) if _wants_nodes(opts) else ()
    visible = mig.uuid if opts.device_id_strategy == "uuid" else f"{gpu.index}:{mig.index}"
    env, mounts = _delivery(opts, visible)
    nodes: tuple[DeviceNode, ...] = ()
    if _wants_nodes(opts):
        parent = DeviceNode(_host(opts, f"/dev/nvidia{gpu.minor}"), f"/dev/nvidia{gpu.minor}")
        caps = [
            _cap_node(opts, gpu, f"gi{mig.gi}"),
            _cap_node(opts, gpu, f"gi{mig.gi}/ci{mig.ci}"),
        ]
        nodes = (*shared, parent, *(c for c in caps if c))
    attrs = _common_attributes(node, gpu)
    attrs.update(
        uuid=mig.uuid,
        index=f"{gpu.index}:{mig.index}",
        parentUUID=gpu.uuid,
        migProfile=mig.profile,
        memoryMiB=mig.memory_mib,
        gpuInstance=mig.gi,
        computeInstance=mig.ci,
    )
    return Device(
        id=mig.uuid,
        resource=resource,
        numa_nodes=gpu.numa,  # type: ignore[arg-type]
        nodes=nodes,
        mounts=mounts,
        env=env,
        parent=gpu.uuid,
        attributes=attrs,
    )
