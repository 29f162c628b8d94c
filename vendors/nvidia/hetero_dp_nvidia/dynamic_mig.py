"""Dynamic MIG for DRA mode: every possible placement published, instances made on prepare.

With ``dynamicMig``, a GPU in MIG mode is published whole and with one
partition per possible GPU-instance placement (``nvmlDeviceGetGpuInstance
PossiblePlacements``). The GPU's counter set holds one counter per memory
slice (``memory-slice-0`` ... ``-7`` on an A100); a placement draws the slices
it covers, and the whole GPU draws them all, so the scheduler never hands out
two placements that overlap, nor one beside the whole GPU. This is the model
of KEP-4815's A100 example and of NVIDIA's DRA driver (memory slices per
placement).

Nothing exists until a claim gets a device. ``prepare`` creates the GPU
instance at the placement and one compute instance spanning it, and hands out
that MIG device; for the whole GPU it creates the full-size instance (a GPU in
MIG mode runs CUDA only inside an instance), which is why the full-size
profile is not published a second time as a partition. ``unprepare`` destroys
them. Creation is idempotent: an instance already at the placement (a prepare
that crashed before its checkpoint) is taken over.

Device IDs name the placement: ``<GPU UUID>-mig-<profile ID>-<start>``, so an
unprepare after a restart finds the instance from the checkpoint alone.
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import pynvml

from hetero_dp import Device

from . import nvml
from .discovery import (
    PROFILE_SUFFIX,
    GpuInfo,
    NodeInfo,
    gi_profiles,
    mig_profile,
    mig_record,
    read_migs,
)
from .nvml import NVMLError, explain, log, log_once
from .options import Options

# nvml.h NVML_COMPUTE_INSTANCE_PROFILE_* enums (1, 2, 3, 4, 7, 8, 6 slices, 1 REV1)
CI_PROFILE_COUNT = 8
ENGINE_SHARED = 0  # NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
IN_USE = pynvml.NVML_ERROR_IN_USE
INSUFFICIENT_RESOURCES = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES

_ID = re.compile(r"^(?P<gpu>.+)-mig-(?P<profile>\d+)-(?P<start>\d+)$")


class MigError(RuntimeError):
    """A MIG instance could not be made or removed; the message says which and why."""


@dataclass(frozen=True)
class Placement:
    gpu_uuid: str
    profile_id: int  # the GPU instance profile ID NVML reports (19 = 1g.5gb on an A100)
    start: int  # first memory slice
    size: int  # memory slices
    profile: str  # NVIDIA's name, 1g.5gb
    memory_mib: int
    gi_slices: int  # the profile's compute slices (a compute instance spanning them)
    instances: int  # how many instances of the profile a GPU holds at most

    @property
    def id(self) -> str:
        return f"{self.gpu_uuid}-mig-{self.profile_id}-{self.start}"

    @property
    def slices(self) -> dict[str, int]:
        return {counter(i): 1 for i in range(self.start, self.start + self.size)}


def counter(i: int) -> str:
    return f"memory-slice-{i}"


def all_slices(n: int) -> dict[str, int]:
    return {counter(i): 1 for i in range(n)}


def parse_id(device_id: str) -> tuple[str, int, int] | None:
    """(GPU UUID, profile ID, start) of a placement's device ID, or None."""
    m = _ID.match(device_id)
    if m is None:
        return None
    return m["gpu"], int(m["profile"]), int(m["start"])


def possible(handle: Any, profile_id: int) -> list[tuple[int, int]]:
    """(start, size) of every placement of a profile, occupied or not."""
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    if not count.value:
        return []
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
        handle, profile_id, array, ctypes.byref(count)
    )
    return [(int(p.start), int(p.size)) for p in array[: count.value]]


def placements(gpu: GpuInfo) -> list[Placement]:
    """Every placement of every plain profile of ``gpu``, the full-size one included.

    Profiles with attributes (``+me``, ``+gfx`` ...) are left out: they share
    engines that memory-slice counters do not model.
    """
    found = [
        (info, possible(gpu.handle, int(info.id)))
        for enum, info in gi_profiles(gpu)
        if enum not in PROFILE_SUFFIX
    ]
    total = max((s + n for _i, places in found for s, n in places), default=0)
    out = []
    for info, places in found:
        for start, size in places:
            memory = int(info.memorySizeMB) or gpu.memory_mib * size // max(total, 1)
            out.append(
                Placement(
                    gpu_uuid=gpu.uuid,
                    profile_id=int(info.id),
                    start=start,
                    size=size,
                    profile=mig_profile(int(info.sliceCount), 0, memory),
                    memory_mib=memory,
                    gi_slices=int(info.sliceCount),
                    instances=max(int(info.instanceCount), 1),
                )
            )
    return out


def memory_slices(places: list[Placement]) -> int:
    """How many memory slices the GPU has: the end of its furthest placement."""
    return max((p.start + p.size for p in places), default=0)


def _instance_at(handle: Any, place: Placement) -> Any | None:
    """The GPU instance of ``place``'s profile at its first memory slice, if any."""
    array = (pynvml.c_nvmlGpuInstance_t * place.instances)()
    count = ctypes.c_uint(place.instances)
    pynvml.nvmlDeviceGetGpuInstances(handle, place.profile_id, array, ctypes.byref(count))
    for gi in array[: count.value]:
        if int(pynvml.nvmlGpuInstanceGetInfo(gi).placement.start) == place.start:
            return gi
    return None


def _ci_profiles(gi: Any) -> list[Any]:
    """The compute instance profiles a GPU instance has (profile info, v1)."""
    out = []
    for enum in range(CI_PROFILE_COUNT):
        try:
            out.append(
                pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, enum, ENGINE_SHARED, version=1
                )
            )
        except NVMLError as err:
            if err.value in (nvml.NOT_SUPPORTED, nvml.INVALID_ARGUMENT):
                continue
            raise
    return out


def _compute_instances(gi: Any) -> list[Any]:
    out = []
    for info in _ci_profiles(gi):
        n = max(int(info.instanceCount), 1)
        array = (pynvml.c_nvmlComputeInstance_t * n)()
        count = ctypes.c_uint(n)
        pynvml.nvmlGpuInstanceGetComputeInstances(gi, int(info.id), array, ctypes.byref(count))
        out.extend(array[: count.value])
    return out


def _whole_ci_profile(gi: Any, slices: int) -> int:
    """The compute instance profile ID that spans all ``slices`` of the GPU instance."""
    for info in _ci_profiles(gi):
        if int(info.sliceCount) == slices:
            return int(info.id)
    raise MigError(f"no compute instance profile spans the {slices} slices of the GPU instance")


def create(handle: Any, place: Placement) -> int:
    """Make the GPU instance at ``place`` and a compute instance spanning it; its GI ID.

    An instance already there is taken over (and given a compute instance if it
    has none). NVML errors become a :class:`MigError` that says what to do.
    """
    what = f"MIG {place.profile} at memory slice {place.start} of GPU {place.gpu_uuid}"
    try:
        gi = _instance_at(handle, place)
        made = gi is None
        if gi is None:
            spot = pynvml.c_nvmlGpuInstancePlacement_t()
            spot.start, spot.size = place.start, place.size
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, place.profile_id, ctypes.byref(spot)
            )
        gi_info = pynvml.nvmlGpuInstanceGetInfo(gi)
        if not _compute_instances(gi):
            try:
                pynvml.nvmlGpuInstanceCreateComputeInstance(
                    gi, _whole_ci_profile(gi, place.gi_slices)
                )
            except BaseException:
                if made:
                    pynvml.nvmlGpuInstanceDestroy(gi)
                raise
        return int(gi_info.id)
    except NVMLError as err:
        if err.value == INSUFFICIENT_RESOURCES:
            raise MigError(
                f"cannot create {what}: its memory slices are taken by an instance this "
                "driver did not make; fix: remove MIG instances made by hand or by "
                "mig-manager (nvidia-smi mig -dci; nvidia-smi mig -dgi) on GPUs under dynamicMig"
            ) from None
        if err.value == nvml.NO_PERMISSION:
            raise MigError(
                f"cannot create {what}: permission denied; fix: run the plugin as root "
                "with CAP_SYS_ADMIN (MIG management needs it)"
            ) from None
        raise MigError(nvml.explain(err, f"creating {what}", place.gpu_uuid)) from None


def destroy(handle: Any, place: Placement) -> bool:
    """Destroy the instance at ``place``; False when none was there."""
    try:
        gi = _instance_at(handle, place)
        if gi is None:
            return False
        for ci in _compute_instances(gi):
            pynvml.nvmlComputeInstanceDestroy(ci)
        pynvml.nvmlGpuInstanceDestroy(gi)
        return True
    except NVMLError as err:
        where = f"the MIG {place.profile} instance at memory slice {place.start}"
        if err.value == IN_USE:
            raise MigError(
                f"cannot destroy {where} of GPU {place.gpu_uuid}: processes still use it; "
                "the kubelet retries once they are gone"
            ) from None
        raise MigError(nvml.explain(err, f"destroying {where}", place.gpu_uuid)) from None


# ---- device records ------------------------------------------------------------

# the whole GPU's attributes that name the GPU itself, not a placement on it
_GPU_ONLY = ("uuid", "index", "minor", "memoryMiB", "migEnabled")


class Partitioner:
    """The backend's dynamic MIG state: the placements of each GPU in MIG mode (fixed
    per GPU model, so read from NVML once)."""

    def __init__(self) -> None:
        self._places: dict[str, list[Placement]] = {}  # GPU UUID -> every placement

    def _placements_of(self, gpu: GpuInfo) -> list[Placement]:
        places = self._places.get(gpu.uuid)
        if places is None:
            places = self._places[gpu.uuid] = placements(gpu)
        return places

    def whole(self, node: NodeInfo, devices: list[Device]) -> list[Device]:
        """The GPU records, each GPU in MIG mode drawing every memory slice."""
        out = []
        for d in devices:
            gpu = node.gpu(d.id)
            if gpu is not None and gpu.mig_enabled and not gpu.error and gpu.handle is not None:
                try:
                    n = memory_slices(self._placements_of(gpu))
                except NVMLError as err:
                    log_once(
                        f"mig-slices:{gpu.uuid}:{err.value}",
                        explain(err, "reading the MIG placements", gpu.uuid)
                        + "; the GPU is published without MIG partitions",
                    )
                    n = 0
                if n:
                    d = dataclasses.replace(d, consumes=all_slices(n))
            out.append(d)
        return out

    def partitions(self, node: NodeInfo, devices: list[Device]) -> list[Device]:
        """One record per placement of every GPU that draws memory slices, less the
        full-size one (the whole GPU)."""
        out = []
        for d in devices:
            gpu = node.gpu(d.id)
            places = self._places.get(d.id)
            if not d.consumes or gpu is None or not places:
                continue
            n = memory_slices(places)
            base = {k: v for k, v in d.attributes.items() if k not in _GPU_ONLY}
            for place in places:
                if place.start == 0 and place.size == n:
                    continue  # the whole GPU
                out.append(
                    Device(
                        id=place.id,
                        resource=d.resource,
                        parent=gpu.uuid,
                        numa_nodes=d.numa_nodes,
                        consumes=place.slices,
                        attributes={
                            **base,
                            "parentUUID": gpu.uuid,
                            "migProfile": place.profile,
                            "memoryMiB": place.memory_mib,
                            "migPlacementStart": place.start,
                            "migPlacementSize": place.size,
                        },
                    )
                )
        return out

    def _placement(self, node: NodeInfo, device_id: str) -> tuple[GpuInfo, Placement] | None:
        parsed = parse_id(device_id)
        if parsed is not None:
            gpu = node.gpu(parsed[0])
            if gpu is None or gpu.handle is None:
                raise MigError(f"GPU {parsed[0]} of {device_id} is not on this node now")
            try:
                places = self._placements_of(gpu)
            except NVMLError as err:
                raise MigError(explain(err, "reading the MIG placements", gpu.uuid)) from None
            for place in places:
                if (place.profile_id, place.start) == parsed[1:]:
                    return gpu, place
            raise MigError(f"GPU {gpu.uuid} has no MIG placement {device_id}")
        gpu = node.gpu(device_id)
        places = self._places.get(device_id)
        if gpu is None or gpu.handle is None or not places:
            return None  # a GPU without MIG mode: nothing to make
        # the full-size placement: what a claim for the whole GPU gets in MIG mode
        return gpu, max(places, key=lambda p: p.size)

    def prepare(self, node: NodeInfo, devices: list[Device], opts: Options) -> list[Device]:
        """Make the claim's instances; the records to use (on failure, none is left)."""
        out: list[Device] = []
        made: list[tuple[GpuInfo, Placement]] = []
        try:
            for d in devices:
                found = self._placement(node, d.id)
                if found is None:
                    out.append(d)
                    continue
                gpu, place = found
                gi = create(gpu.handle, place)
                made.append(found)
                mig = next((m for m in read_migs(gpu) if m.gi == gi), None)
                if mig is None:
                    raise MigError(
                        f"MIG instance {gi} of GPU {gpu.uuid} was created but NVML does not "
                        "list it as a MIG device"
                    )
                rec = mig_record(node, gpu, mig, opts, d.resource)
                out.append(
                    dataclasses.replace(
                        rec,
                        id=d.id,
                        parent=d.parent,
                        attributes={**d.attributes, **rec.attributes},
                        consumes=d.consumes,
                    )
                )
        except BaseException:
            for gpu, place in made:
                try:
                    destroy(gpu.handle, place)
                except MigError as e:
                    log.error("undoing a failed prepare: %s", e)
            raise
        return out

    def unprepare(self, node: NodeInfo, device_ids: list[str]) -> None:
        """Destroy the instances of the claim's devices; a GPU that is gone has none."""
        errors = []
        for device_id in device_ids:
            try:
                found = self._placement(node, device_id)
            except MigError as e:
                log.warning("unprepare: %s; nothing to destroy", e)
                continue
            if found is None:
                continue
            gpu, place = found
            try:
                if not destroy(gpu.handle, place):
                    log.info("unprepare: no MIG instance at %s (already destroyed)", device_id)
            except MigError as e:
                errors.append(str(e))
        if errors:
            raise MigError("; ".join(errors))
