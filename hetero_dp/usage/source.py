"""What attribution reads from a running daemon: its devices, its settings and the
backends' ``usage`` hooks."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from hetero_dp.kits import observe
from hetero_dp.model.device import Device, replica_base
from hetero_dp.model.errors import BackendError
from hetero_dp.model.names import CHECKPOINT_FILE
from hetero_dp.model.usage import ProcessUsage
from hetero_dp.usage.attribution import Settings
from hetero_dp.usage.view import Inventory

if TYPE_CHECKING:
    from hetero_dp.engine.config import Config
    from hetero_dp.engine.daemon import Daemon

log = logging.getLogger(__name__)


def inventory(daemon: Daemon) -> Inventory:
    """Per resource, each advertised ID and the record behind it."""
    records: dict[str, dict[str, Device]] = {}
    for name, res in daemon.resources.items():
        state = res.state
        records[name] = {d.id: state.physical(replica_base(d.id)) or d for d in state.devices}
    return Inventory(records)


def settings(config: Config) -> Settings:
    section = config.attribution
    return Settings(
        pod_resources_socket=section.pod_resources_socket,
        proc_root=section.proc_root,
        container_logs_dir=section.container_logs_dir,
        checkpoint=str(config.kubelet_dir / CHECKPOINT_FILE),
    )


async def usages(daemon: Daemon, timeout: float) -> list[ProcessUsage]:
    """Every backend's ``usage`` answer, concurrently; one that fails counts as a hook
    error and reports nothing."""
    runtimes = [rt for rt in daemon.runtimes.values() if rt.backend.implements("usage")]
    found = await asyncio.gather(*(_usage(rt, timeout) for rt in runtimes))
    return [u for us in found for u in us]


async def _usage(rt: Any, timeout: float) -> list[ProcessUsage]:
    b = rt.backend
    try:
        result: list[ProcessUsage] = await b.call(
            "usage", devices=list(rt.published.values()), timeout=min(b.timeout, timeout)
        )
    except BackendError as e:
        log.error("%s", e, extra={"backend": b.name, "hook": "usage"})
        observe.emit("hook_error", backend=b.name, hook="usage", error=str(e))
        return []
    return result
