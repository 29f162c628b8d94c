"""Looking at what a backend sees, without a kubelet: ``hetero-dp list``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from hetero_dp.engine.config import Config
from hetero_dp.engine.plugins import Backend, load_backends
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError, ConfigError


@contextlib.asynccontextmanager
async def configured_backend(spec: str, cfg: Config) -> AsyncIterator[Backend]:
    """One backend, loaded and configured, shut down on exit; its failures become
    ConfigError naming the backend (for commands that look without a kubelet)."""
    (backend,) = load_backends([spec], timeout=cfg.hook_timeout)
    backend.options = cfg.backend_options(backend.name)
    try:
        await backend.configure(backend.options)
        yield backend
    finally:
        with contextlib.suppress(BackendError):
            await backend.call("shutdown", timeout=5)
        backend.close()


async def discover_once(spec: str, cfg: Config) -> list[Device]:
    """Configure one backend and run its discovery once."""
    async with configured_backend(spec, cfg) as backend:
        try:
            return await backend.discover()
        except BackendError as e:
            raise ConfigError(str(e), source=f"backend {backend.name}") from None


def device_table(devices: Sequence[Device]) -> str:
    """A fixed-width table: ID, resource, health, NUMA, device nodes."""
    rows = [("ID", "RESOURCE", "HEALTH", "NUMA", "NODES")]
    for d in devices:
        health = d.health + (f" ({d.reason})" if d.reason else "")
        nodes = ",".join(n.container_path for n in d.nodes if not n.shared) or "-"
        numa = ",".join(str(n) for n in d.numa_nodes) or "-"
        rows.append((d.id, d.resource, health, numa, nodes))
    if len(rows) == 1:
        return "no devices found"
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def devices_json(devices: Sequence[Device]) -> list[dict[str, Any]]:
    return [
        {
            "id": d.id,
            "resource": d.resource,
            "health": d.health,
            "reason": d.reason,
            "numaNodes": list(d.numa_nodes),
            "parent": d.parent,
            "index": d.index,
            "nodes": [
                {
                    "hostPath": n.host_path,
                    "containerPath": n.container_path,
                    "permissions": n.permissions,
                    "shared": n.shared,
                }
                for n in d.nodes
            ],
            "mounts": [
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "readOnly": m.read_only,
                }
                for m in d.mounts
            ],
            "env": dict(d.env),
            "annotations": dict(d.annotations),
            "attributes": dict(d.attributes),
        }
        for d in devices
    ]
