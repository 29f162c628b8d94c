"""Step 1, the driver: each backend's own ``doctor`` checks, its options read from the config."""

from __future__ import annotations

from collections.abc import Sequence

from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.model.errors import BackendError, ConfigError
from hetero_dp.ops.doctor.findings import STATUSES, Finding


async def check_driver(config: Config, backends: Sequence[Backend]) -> list[Finding]:
    if not backends:
        return [
            Finding(
                "driver",
                "backend checks",
                "skip",
                "no backend given, so no driver checks",
                "name the backends the node runs: hetero-dp doctor BACKEND...",
            )
        ]
    out = []
    for b in backends:
        if not b.implements("doctor"):
            out.append(Finding("driver", b.name, "skip", f"backend {b.name!r} offers no checks"))
            continue
        try:
            options = b.read_options_from(config)
        except ConfigError as e:
            out.append(
                Finding(
                    "driver",
                    b.name,
                    "fail",
                    f"backend {b.name!r} refuses its options: {e}",
                    "fix the option the message names, where the message says it was written; "
                    f"hetero-dp list --options {b.name} lists them all",
                )
            )
            continue
        try:
            checks = await b.call("doctor", options=options)
        except BackendError as e:
            out.append(
                Finding(
                    "driver",
                    b.name,
                    "fail",
                    f"the backend's own checks crashed: {e.__cause__ or e}",
                    f"run hetero-dp list {b.name} for the backend's error; check its driver",
                )
            )
            continue
        for c in checks:
            status = c.status if c.status in STATUSES else "warn"
            out.append(Finding("driver", f"{b.name}: {c.name}", status, c.message, c.fix))
    return out
