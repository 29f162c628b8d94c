"""``hetero-dp doctor``: the troubleshooting chain of an accelerator node, in order.

Hardware and driver first (the backends' own ``doctor`` checks), then the
devices, then the container runtime, then the kubelet side (``kubelet.sock``
and the plugin's sockets beside it), then the running daemon (``/readyz``),
then what the daemon writes (CDI specs, the node label file). The scheduler
comes last because it is almost never the culprit. Each finding is ``pass``,
``warn``, ``fail`` or ``skip`` (not applicable here) and says how to fix it.

Every path is read under ``root`` (``--root``), so tests run the whole chain
against a fake node tree.

One module per step: ``driver``, ``devices``, ``runtime``, ``kubelet``, ``daemon``,
``fair_share`` (containers over their share of a shared device, from the daemon's
metrics), ``cdi`` and ``labels``; ``cdi_spec`` validates a CDI spec, ``findings`` holds
what each step returns and how the chain is shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.engine.settings import ResourceSettings
from hetero_dp.ops.doctor.cdi import check_cdi_specs
from hetero_dp.ops.doctor.cdi_spec import spec_problems
from hetero_dp.ops.doctor.daemon import check_daemon
from hetero_dp.ops.doctor.devices import check_devices
from hetero_dp.ops.doctor.driver import check_driver
from hetero_dp.ops.doctor.fair_share import check_fair_share
from hetero_dp.ops.doctor.findings import (
    STATUSES,
    DoctorSettings,
    Finding,
    exit_code,
    render_json,
    render_text,
)
from hetero_dp.ops.doctor.kubelet import check_kubelet, socket_listens
from hetero_dp.ops.doctor.labels import check_labels
from hetero_dp.ops.doctor.runtime import (
    RuntimeView,
    check_runtime,
    containerd_view,
    docker_view,
)

__all__ = [
    "STATUSES",
    "DoctorSettings",
    "Finding",
    "RuntimeView",
    "containerd_view",
    "docker_view",
    "exit_code",
    "render_json",
    "render_text",
    "run_doctor",
    "socket_listens",
    "spec_problems",
]


# --- the chain -------------------------------------------------------------------------------


async def run_doctor(
    config: Config, backends: Sequence[Backend], settings: DoctorSettings
) -> list[Finding]:
    """Walk the chain; never raises for what it finds (that is what findings are for)."""
    out: list[Finding] = []
    driver = await check_driver(config, backends)
    out += driver
    failed = {f.name.split(":")[0] for f in driver if f.status == "fail"}
    device_findings, resources = await check_devices(config, backends, failed)
    out += device_findings
    needs = _needs(config, backends, resources)  # resources: name -> effective settings
    out += await check_runtime(settings, "cdi" in needs, backends)
    out += check_kubelet(config, settings)
    out += check_daemon(config, settings)
    out += check_fair_share(config, settings)
    out += check_cdi_specs(config, settings, needs)
    out += check_labels(config, settings, backends)
    return out


def _needs(
    config: Config, backends: Sequence[Backend], resources: Mapping[str, ResourceSettings]
) -> set[str]:
    """What the runtime must offer: ``cdi`` when some resource delivers through CDI."""
    needs = set()
    if config.cdi.enabled:
        needs.add("cdi")
    for settings in [*resources.values(), *config.resources.values()]:
        if settings.delivery.uses_cdi:
            needs.add("cdi")
    return needs
