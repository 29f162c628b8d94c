"""Looking at what a backend sees, without a kubelet: ``hetero-dp list``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from hetero_dp.allocation.gate import gate_device
from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.engine.loading import load_backends
from hetero_dp.engine.publishing import check_names
from hetero_dp.model.device import Device
from hetero_dp.model.errors import BackendError
from hetero_dp.model.options import camel


def load_one(spec: str | Backend) -> Backend:
    """A backend by name or ``.py`` path (a loaded one as it is), as ``run`` loads it."""
    if isinstance(spec, Backend):
        return spec
    (backend,) = load_backends([spec])
    return backend


@contextlib.asynccontextmanager
async def configured_backend(spec: str | Backend, cfg: Config) -> AsyncIterator[Backend]:
    """One backend, loaded and configured as ``run`` configures it, shut down on exit
    (for commands that look without a kubelet)."""
    backend = load_one(spec)
    backend.timeout = cfg.hook_timeout
    try:
        await backend.configure_from(cfg)
        yield backend
    finally:
        with contextlib.suppress(BackendError):
            await backend.call("shutdown")
        backend.close()


async def judged(backend: Backend, devices: list[Device]) -> list[Device]:
    """``devices`` with the health the daemon would give them now: the backend's
    ``check_health`` run once over them (under ``hookTimeout``, as the daemon's poll:
    a raise or a timeout is an Unhealthy verdict naming the hook), and a slice or
    replica of an unhealthy parent unhealthy with the parent's reason."""
    verdicts = await backend.check_health_many(devices)
    out = []
    for d in devices:
        healthy, reason = verdicts.get(d.id, (d.healthy, d.reason))
        out.append(
            d if (healthy, reason) == (d.healthy, d.reason) else d.with_health(healthy, reason)
        )
    by_id = {d.id: d for d in out}
    for i, d in enumerate(out):
        parent = by_id.get(d.parent) if d.parent is not None else None
        if d.healthy and parent is not None and not parent.healthy:
            out[i] = d.with_health(False, parent.reason)
    return out


async def discover_once(spec: str | Backend, cfg: Config, *, health: bool = True) -> list[Device]:
    """Configure one backend, run its discovery once, check what it found as ``run``
    checks it at start-up (:func:`~hetero_dp.engine.publishing.check_names`: a
    resource name the kubelet refuses makes its devices Unhealthy with the reason here,
    and ConfigError when nothing is left; the container gate refuses what may not go
    into a container), and (unless ``health`` is False) run its health check over the
    rest (:func:`judged`). A failing hook raises BackendError."""
    async with configured_backend(spec, cfg) as backend:
        devices = await backend.call("discover")
        refused = check_names({backend.name: devices}, cfg.sharing)
        if health:
            devices = await judged(backend, devices)
        # the container gate, as the daemon applies it to what a backend discovers (a
        # node outside /dev, a read-write mount of /, LD_PRELOAD ...), with the temp dir
        # taken for fake device nodes as `run --fake-kubelet` takes it
        fake_roots = (os.path.realpath(tempfile.gettempdir()),)
        return [
            d.with_health(False, f"refused: {refused[d.id]}")
            if d.id in refused
            else gate_device(d, fake_roots)
            for d in devices
        ]


def searched(options: object) -> list[str]:
    """``key=value`` for each option of a configured backend that says where it looked
    (a string value that is a glob or an absolute path), for ``no devices found``."""
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        items = [(camel(f.name), getattr(options, f.name)) for f in dataclasses.fields(options)]
    elif isinstance(options, Mapping):
        items = [(str(k), v) for k, v in options.items()]
    else:
        return []
    return [
        f"{key}={value}"
        for key, value in items
        if isinstance(value, str) and (value.startswith("/") or any(c in value for c in "*?["))
    ]


def device_table(devices: Sequence[Device], searched: Sequence[str] = ()) -> str:
    """A fixed-width table: ID, resource, health, NUMA, device nodes; with no devices,
    ``no devices found`` and where the backend looked (``searched``)."""
    rows = [("ID", "RESOURCE", "HEALTH", "NUMA", "NODES")]
    for d in devices:
        health = d.health + (f" ({d.reason})" if d.reason else "")
        nodes = ",".join(n.container_path for n in d.nodes if not n.shared) or "-"
        numa = ",".join(str(n) for n in d.numa_nodes) or "-"
        rows.append((d.id, d.resource, health, numa, nodes))
    if len(rows) == 1:
        where = f" (searched: {', '.join(searched)})" if searched else ""
        return f"no devices found{where}"
    return _table(rows)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def options_table(spec: str, *, as_json: bool = False) -> str:
    """The options a backend declares (``hetero-dp list --options``), as a table or
    JSON; a backend that declares none says what it takes instead."""
    import json

    from hetero_dp.model.options import describe

    (backend,) = load_backends([spec])
    try:
        schema = backend.schema
    finally:
        backend.close()
    rows = describe(schema) if schema is not None else []
    if as_json:
        return json.dumps([r.__dict__ for r in rows], indent=2)
    if schema is None:
        if backend.implements("configure"):
            return (
                f"backend {backend.name!r} declares no typed options: its configure hook "
                "reads a plain mapping (see its documentation)"
            )
        return f"backend {backend.name!r} takes no options"
    if not rows:
        return f"backend {backend.name!r} takes no options"
    table = [("OPTION", "TYPE", "DEFAULT", "ENV", "HELP")]
    table += [(r.key, r.type, r.default, r.env or "-", r.help) for r in rows]
    return (
        f"options of backend {backend.name!r} (backends.{backend.name}.OPTION in the config "
        f"file, -o {backend.name}.OPTION=VALUE):\n" + _table(table)
    )


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
