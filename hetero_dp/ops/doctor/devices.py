"""Step 2, the devices: configure and discover each backend once."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Sequence

from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.engine.settings import ResourceSettings, read_defaults
from hetero_dp.model.errors import BackendError, ConfigError, StartError
from hetero_dp.ops.doctor.findings import Finding


async def check_devices(
    config: Config, backends: Sequence[Backend], driver_failed: Collection[str] = ()
) -> tuple[list[Finding], dict[str, ResourceSettings]]:
    """Configure and discover each backend once; also each resource's effective settings
    (the backend's ``resource_defaults`` under the config's section). ``driver_failed``:
    the backends whose driver check failed, whose failures here follow from it (said
    once, there)."""
    out: list[Finding] = []
    resources: dict[str, ResourceSettings] = {}
    for b in backends:
        try:
            try:
                await b.configure_from(config)
            except StartError as e:  # the hook failed: the cause is not the config
                if b.name in driver_failed:
                    message = f"backend {b.name!r} cannot start: the driver check above says why"
                    fix = "fix the driver first (see its fix above)"
                else:
                    message = f"backend {b.name!r} cannot start: {e}"
                    fix = f"what the message names; then hetero-dp list {b.name}"
                out.append(Finding("devices", b.name, "fail", message, fix))
                continue
            except ConfigError as e:
                out.append(
                    Finding(
                        "devices",
                        b.name,
                        "fail",
                        f"backend {b.name!r} refuses its options: {e}",
                        "fix the field the message names, in the place it says it was written",
                    )
                )
                continue
            try:
                devices = await b.call("discover")
            except BackendError as e:
                failed = b.name in driver_failed
                out.append(
                    Finding(
                        "devices",
                        b.name,
                        "fail",
                        "discovery failed"
                        + (": the driver check above says why" if failed else f": {e}"),
                        "fix the driver problem above first; then hetero-dp list " + b.name
                        if failed
                        else "what the message names; then hetero-dp list " + b.name,
                    )
                )
                continue
            for name in sorted({d.resource for d in devices}):
                entry = config.resource_settings(name)
                try:
                    given = await b.call("resource_defaults", resource=name)
                    defaults = read_defaults(given, name, b.name, entry)
                except (BackendError, ConfigError):  # the daemon logs it and goes on so
                    defaults = None
                resources[name] = entry.over(defaults)
        finally:
            with contextlib.suppress(BackendError):
                await b.call("shutdown")
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
