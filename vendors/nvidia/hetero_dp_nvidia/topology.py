"""GPU pair scores from NVML: NVLink links and the PCIe path, NVIDIA's weights.

Scores are higher-is-better and add up per pair, as in NVIDIA's allocator:
100 per NVLink link, plus the PCIe path (same board 60, single switch 50,
multiple switches 40, host bridge 30, same CPU 20, across CPUs 10).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pynvml

from hetero_dp import Link

from . import nvml
from .discovery import GpuInfo
from .nvml import NVMLError, explain, log_once

NVLINK_SCORE = 100
# NVML topology level -> (score, nvidia-smi topo name)
PCIE = {
    pynvml.NVML_TOPOLOGY_INTERNAL: (60, "BOARD"),
    pynvml.NVML_TOPOLOGY_SINGLE: (50, "PIX"),
    pynvml.NVML_TOPOLOGY_MULTIPLE: (40, "PXB"),
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: (30, "PHB"),
    pynvml.NVML_TOPOLOGY_NODE: (20, "NODE"),
    pynvml.NVML_TOPOLOGY_SYSTEM: (10, "SYS"),
}


def nvlink_peers(gpu: GpuInfo) -> Counter[str]:
    """Active NVLink links of a GPU, counted per remote PCI bus ID (normalised)."""
    peers: Counter[str] = Counter()
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(gpu.handle, link):
                continue
            remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(gpu.handle, link)
        except NVMLError as err:
            if err.value in (nvml.INVALID_ARGUMENT, nvml.NOT_SUPPORTED, nvml.NOT_FOUND):
                break  # past the GPU's last link, or no NVLink at all
            log_once(f"nvlink:{gpu.uuid}:{err.value}", explain(err, "reading NVLink", gpu.uuid))
            break
        peers[nvml.normalise_bus_id(remote.busId)] += 1
    return peers


def pcie_level(a: GpuInfo, b: GpuInfo) -> int | None:
    try:
        return int(pynvml.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle))
    except NVMLError as err:
        log_once(f"topo:{err.value}", explain(err, "reading the PCIe topology", a.uuid))
        return None


def compute_links(gpus: Sequence[GpuInfo]) -> list[Link]:
    """One Link per unordered pair of the given GPUs (handles must be live).

    Links whose far end is not one of the GPUs go to NVSwitches (HGX/DGX boards):
    every GPU on the switches reaches every other, so such a pair counts the
    smaller of the two GPUs' switch-link counts.
    """
    usable = [g for g in gpus if g.handle is not None and not g.error]
    by_bus = {g.pci_bus_id: g.uuid for g in usable}
    nvlinks: dict[tuple[str, str], int] = {}
    switch_links: dict[str, int] = {}
    for g in usable:
        for bus, n in nvlink_peers(g).items():
            peer = by_bus.get(bus)
            if peer is None:
                switch_links[g.uuid] = switch_links.get(g.uuid, 0) + n
            elif peer != g.uuid:
                # Each side reports the same links; keep the larger count, not the sum.
                key = (min(g.uuid, peer), max(g.uuid, peer))
                nvlinks[key] = max(nvlinks.get(key, 0), n)
    links = []
    for i, a in enumerate(usable):
        for b in usable[i + 1 :]:
            key = (min(a.uuid, b.uuid), max(a.uuid, b.uuid))
            n = nvlinks.get(key, 0)
            n += min(switch_links.get(a.uuid, 0), switch_links.get(b.uuid, 0))
            level = pcie_level(a, b)
            pcie_score, pcie_kind = PCIE.get(level, (0, "")) if level is not None else (0, "")
            score = n * NVLINK_SCORE + pcie_score
            kind = f"NV{n}" if n else pcie_kind
            if score:
                links.append(Link(a.uuid, b.uuid, score, kind))
    return links
