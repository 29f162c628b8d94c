"""Node labels with GPU feature discovery's names (all under ``nvidia.com/``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hetero_dp import Device, is_replica, replica_base

from .discovery import GPU_RESOURCE, NodeInfo
from .options import Options

PREFIX = "nvidia.com/"


def _product(name: str) -> str:
    return name.strip().replace(" ", "-")


def node_labels(devices: Sequence[Device], node: NodeInfo, opts: Options) -> dict[str, str]:
    """GFD-style labels for what is advertised (replicas from sharing included)."""
    labels: dict[str, str] = {}
    gpus = [g for g in node.gpus if g.uuid]
    major, minor, rev = ([*node.driver_version.split("."), "", "", ""])[:3]
    if major:
        labels.update({"cuda.driver.major": major, "cuda.driver.minor": minor})
        labels["cuda.driver.rev"] = rev
    if node.cuda_version:
        cmaj, cmin = node.cuda_major_minor
        labels.update({"cuda.runtime.major": str(cmaj), "cuda.runtime.minor": str(cmin)})
    labels["mig.capable"] = str(any(g.mig_capable for g in gpus)).lower()
    labels["mig.strategy"] = opts.mig_strategy

    # Replicas per physical device, per resource: sharing shows up as "<id>::<n>".
    replicas: Counter[tuple[str, str]] = Counter((d.resource, replica_base(d.id)) for d in devices)
    shared = any(is_replica(d.id) for d in devices)
    by_resource: dict[str, dict[str, Device]] = {}
    for d in devices:
        by_resource.setdefault(d.resource, {}).setdefault(replica_base(d.id), d)

    gpu_devices = [
        d
        for res, devs in by_resource.items()
        for d in devs.values()
        if res.startswith(GPU_RESOURCE)
    ]
    if gpus:
        first = gpus[0]
        labels["gpu.family"] = first.family
        labels["gpu.compute.major"] = str(first.cc[0])
        labels["gpu.compute.minor"] = str(first.cc[1])
        product, memory = _product(first.name), first.memory_mib
        count = len(gpus)
        if gpu_devices:
            sample = gpu_devices[0]
            count = len(gpu_devices)
            memory = int(sample.attributes.get("memoryMiB", memory))
            profile = sample.attributes.get("migProfile")
            if profile:  # MIG strategy single: slices are the GPUs
                product = f"{product}-MIG-{profile}"
        elif any(d.resource.startswith("nvidia.com/mig-") for d in devices):
            count = 0
        n_replicas = max(
            (n for (res, _), n in replicas.items() if res.startswith(GPU_RESOURCE)), default=1
        )
        if shared and n_replicas > 1 and GPU_RESOURCE in by_resource:
            product += "-SHARED"  # shared and not renamed
        labels["gpu.product"] = product
        labels["gpu.memory"] = str(memory)
        labels["gpu.count"] = str(count)
        labels["gpu.replicas"] = str(n_replicas)
        # NVIDIA's values: none, time-slicing, mps (api/config/v1/sharing.go)
        labels["gpu.sharing-strategy"] = opts.sharing.strategy if shared else "none"
    # GFD: mps.capable is "false" unless MPS sharing is configured, then whether the
    # GPUs can serve it (MIG devices cannot; the core refuses them under MPS).
    labels["mps.capable"] = str(opts.uses_mps and bool(gpus)).lower()

    for resource, devs in sorted(by_resource.items()):
        if not resource.startswith("nvidia.com/mig-"):
            continue
        name = resource[len(PREFIX) :]
        sample = next(iter(devs.values()))
        labels[f"{name}.count"] = str(len(devs))
        labels[f"{name}.memory"] = str(sample.attributes.get("memoryMiB", 0))
        labels[f"{name}.replicas"] = str(
            max(n for (res, _), n in replicas.items() if res == resource)
        )
    return {PREFIX + k: v for k, v in labels.items()}
