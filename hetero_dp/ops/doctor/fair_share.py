"""Step 5b, who uses too much of a shared device: the containers the running daemon
reports over their fair share (a shared device's memory x the replicas a container
holds / its replicas), read from its ``/metrics`` as ``hetero-dp top`` reads them, so
doctor needs no kubelet access of its own."""

from __future__ import annotations

from hetero_dp.engine.config import Config
from hetero_dp.ops.doctor.findings import DoctorSettings, Finding
from hetero_dp.ops.nodeview import MAX_BYTES, ViewError, metrics_url, over_fair_share, read

STEP = "usage"
NAME = "fair share"
MIB = 1 << 20


def check_fair_share(config: Config, settings: DoctorSettings) -> list[Finding]:
    address = settings.daemon_address or config.metrics.address
    if not address:
        return [Finding(STEP, NAME, "skip", "no metrics.address configured: no usage to read")]
    try:
        url = metrics_url(address)
        devices = read(url, settings.http_timeout, MAX_BYTES)
    except ViewError as e:
        return [Finding(STEP, NAME, "skip", f"{e}; the daemon step above says why")]
    shared = [h for r in devices for h in r.holders if h.fair_share is not None]
    if not shared:
        return [
            Finding(
                STEP,
                NAME,
                "skip",
                "the daemon reports no container on a shared device with a fair share "
                "(no shared device held, attribution off, or no backend reports usage)",
            )
        ]
    over = over_fair_share(devices)
    if not over:
        return [
            Finding(
                STEP,
                NAME,
                "pass",
                f"{len(shared)} container(s) on shared devices, none over its fair share",
            )
        ]
    findings = []
    for row, h in over:
        assert h.memory is not None and h.fair_share is not None  # over_fair_share says so
        findings.append(
            Finding(
                STEP,
                f"{h.namespace}/{h.pod}",
                "warn",
                f"container {h.container} uses {h.memory / MIB:.0f} MiB of {row.resource} "
                f"{h.device}, over its fair share of {h.fair_share / MIB:.0f} MiB (the "
                f"device's memory x the replicas it holds / {row.replicas or '?'} replicas): "
                "its neighbours on the device may fail to allocate memory",
                "lower the pod's memory use, or give it more replicas or a device of its own "
                "(fewer replicas, MPS memory limits or MIG)",
            )
        )
    return findings
