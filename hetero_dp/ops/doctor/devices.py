"""Step 2, the devices: configure and discover each backend once."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.model.errors import BackendError, ConfigError
from hetero_dp.ops.doctor.findings import Finding


async def check_devices(
    config: Config, backends: Sequence[Backend]
) -> tuple[list[Finding], dict[str, dict[str, Any]]]:
    """Configure and discover each backend once; also each resource's effective settings
    (the backend's ``resource_defaults`` under the config's section)."""
    out: list[Finding] = []
    resources: dict[str, dict[str, Any]] = {}
    for b in backends:
        try:
            try:
                await b.configure_from(config)
            except ConfigError as e:
                out.append(
                    Finding(
                        "devices",
                        b.name,
                        "fail",
                        f"backend {b.name!r} refuses its options: {e}",
                        f"fix the named field of backends.{b.name} in the config",
                    )
                )
                continue
            try:
                devices = await b.discover()
            except BackendError as e:
                out.append(
                    Finding(
                        "devices",
                        b.name,
                        "fail",
                        f"discovery failed: {e.__cause__ or e}",
                        "fix the driver problem above first; then hetero-dp list " + b.name,
                    )
                )
                continue
            for name in sorted({d.resource for d in devices}):
                try:
                    defaults = await b.resource_defaults(name)
                except BackendError:
                    defaults = {}
                resources[name] = {**defaults, **config.resource_settings(name)}
        finally:
            with contextlib.suppress(BackendError):
                await b.call("shutdown", timeout=5)
        if not devices:
            out.append(
                Finding(
                    "devices",
                    b.name,
                    "fail",
                    f"backend {b.name!r} found no devices",
                    "check that the hardware is present (lspci) and its driver is loaded "
                    "(the driver checks above); hetero-dp list " + b.name,
                )
            )
            continue
        counts: dict[str, int] = {}
        for d in devices:
            counts[d.resource] = counts.get(d.resource, 0) + 1
        summary = ", ".join(f"{r}: {n}" for r, n in sorted(counts.items()))
        sick = [d for d in devices if not d.healthy]
        if sick:
            shown = "; ".join(f"{d.id}: {d.reason or 'unhealthy'}" for d in sick[:5])
            out.append(
                Finding(
                    "devices",
                    b.name,
                    "warn",
                    f"{len(devices)} devices ({summary}); {len(sick)} unhealthy: {shown}",
                    "the reasons name the fault; the plugin advertises these as Unhealthy",
                )
            )
        else:
            out.append(Finding("devices", b.name, "pass", f"{len(devices)} devices ({summary})"))
    return out, resources
