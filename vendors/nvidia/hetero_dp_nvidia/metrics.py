"""Metric samples named after NVIDIA's DCGM exporter, per GPU and per MIG device."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml

from hetero_dp import Sample

from . import nvml
from .discovery import NodeInfo
from .nvml import NVMLError, explain, log_once

MIB = 1024 * 1024


def _try(what: str, uuid: str, call: Any, *args: object) -> Any:
    try:
        return call(*args)
    except pynvml.NVMLLibraryMismatchError as err:  # the driver lacks the function
        log_once(f"metric:{what}:mismatch", f"{what} of {uuid}: {err}")
        return None
    except NVMLError as err:
        if err.value != nvml.NOT_SUPPORTED:
            log_once(f"metric:{what}:{uuid}:{err.value}", explain(err, what, uuid))
        return None


def _memory(uuid: str, handle: Any, labels: dict[str, str]) -> Iterator[Sample]:
    """Framebuffer used and free, for a GPU or a MIG device."""
    mem = _try("memory", uuid, pynvml.nvmlDeviceGetMemoryInfo, handle)
    if mem is not None:
        yield Sample(
            "DCGM_FI_DEV_FB_USED",
            mem.used // MIB,
            labels,
            "Framebuffer memory used (in MiB).",
            device_id=uuid,
        )
        yield Sample(
            "DCGM_FI_DEV_FB_FREE",
            mem.free // MIB,
            labels,
            "Framebuffer memory free (in MiB).",
            device_id=uuid,
        )


def node_samples(node: NodeInfo, hostname: str = "") -> Iterator[Sample]:
    for g in node.gpus:
        if g.handle is None or not g.uuid:
            continue
        labels = {
            "gpu": str(g.index),
            "UUID": g.uuid,
            "device": f"nvidia{g.minor}",
            "modelName": g.name,
            "pci_bus_id": g.pci_bus_id,
        }
        if hostname:
            labels["Hostname"] = hostname
        yield from _memory(g.uuid, g.handle, labels)
        util = _try("utilization", g.uuid, pynvml.nvmlDeviceGetUtilizationRates, g.handle)
        if util is not None:
            yield Sample(
                "DCGM_FI_DEV_GPU_UTIL",
                util.gpu,
                labels,
                "GPU utilization (in %).",
                device_id=g.uuid,
            )
            yield Sample(
                "DCGM_FI_DEV_MEM_COPY_UTIL",
                util.memory,
                labels,
                "Memory utilization (in %).",
                device_id=g.uuid,
            )
        temp = _try(
            "temperature",
            g.uuid,
            pynvml.nvmlDeviceGetTemperature,
            g.handle,
            pynvml.NVML_TEMPERATURE_GPU,
        )
        if temp is not None:
            yield Sample(
                "DCGM_FI_DEV_GPU_TEMP",
                float(temp),
                labels,
                "GPU temperature (in C).",
                device_id=g.uuid,
            )
        power = _try("power", g.uuid, pynvml.nvmlDeviceGetPowerUsage, g.handle)
        if power is not None:
            yield Sample(
                "DCGM_FI_DEV_POWER_USAGE",
                power / 1000.0,
                labels,
                "Power draw (in W).",
                device_id=g.uuid,
            )
        for m in g.migs:
            mlabels = dict(labels, GPU_I_ID=str(m.gi), GPU_I_PROFILE=m.profile, MIG_UUID=m.uuid)
            yield from _memory(m.uuid, m.handle, mlabels)
